// PostgreSQL helpers that need no server: the advisory-key hash and conninfo.
#include <gtest/gtest.h>

#include "pg/pg_internal.hpp"
#include "jobguard/error.hpp"
#include "jobguard/guard/postgres.hpp"

using namespace jobguard;
using namespace jobguard::guard;

// The hash is a contract with other languages and with SQL: pinned values
// (python: struct.unpack('>q', hashlib.sha256(name.encode()).digest()[:8])[0]).
TEST(AdvisoryKey, IsFirstEightBytesOfSha256BigEndianSigned) {
  EXPECT_EQ(advisory_key("invoice:48291"), 6181683961215088241LL);
  EXPECT_EQ(advisory_key("tenant:alpha:sync"), -3345883166387789913LL);
  EXPECT_EQ(advisory_key(""), -2039914840885289964LL);
}

TEST(Conninfo, UrlGetsOurConnectTimeoutAndApplicationName) {
  PgOptions o;
  o.url = "postgresql://u:secret@db.example:6543/app?connect_timeout=600";
  o.connect_timeout = std::chrono::seconds(3);
  const auto ci = detail::build_conninfo(o);
  EXPECT_NE(ci.find("connect_timeout=3"), std::string::npos) << ci;
  EXPECT_EQ(ci.find("connect_timeout='600'"), std::string::npos) << ci;
  EXPECT_NE(ci.find("host='db.example'"), std::string::npos) << ci;
  EXPECT_NE(ci.find("port='6543'"), std::string::npos) << ci;
  EXPECT_NE(ci.find("application_name='jobguard'"), std::string::npos) << ci;
}

TEST(Conninfo, TargetDescriptionNeverShowsThePassword) {
  PgOptions o;
  o.url = "postgresql://u:secret@db.example:6543/app";
  const auto d = detail::describe_target(o);
  EXPECT_EQ(d, "PostgreSQL db.example:6543/app");
}

// libpq reads "app:pg/s3cret@db" as host "app", port "pg",
// database "s3cret@db:5432/jobs"; none of that may be shown.
TEST(Conninfo, TargetDescriptionOfASlashyPasswordIsRedacted) {
  PgOptions o;
  o.url = "postgresql://app:pg/s3cret@db:5432/jobs";
  const auto d = detail::describe_target(o);
  EXPECT_EQ(d.find("s3cret"), std::string::npos) << d;
  EXPECT_EQ(d.find(":pg"), std::string::npos) << d;
  EXPECT_EQ(d, "PostgreSQL postgresql://app:***@db:5432/jobs");
}

TEST(Conninfo, MalformedUrlIsInvalidUrlNamingIt) {
  PgOptions o;
  o.url = "host=db.example bogus_option=1";
  try {
    detail::build_conninfo(o);
    FAIL() << "expected invalid_url";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::invalid_url);
    EXPECT_NE(std::string(e.what()).find("bogus_option"), std::string::npos) << e.what();
  }
}

TEST(Conninfo, EmptyUrlSaysWhereToSetIt) {
  PgOptions o;
  try {
    detail::build_conninfo(o);
    FAIL() << "expected invalid_url";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::invalid_url);
    EXPECT_NE(std::string(e.what()).find("JOBGUARD_POSTGRES_URL"), std::string::npos) << e.what();
  }
}

TEST(Conninfo, ZeroTimeoutsAreRefused) {
  PgOptions o;
  o.url = "postgresql://h/db";
  o.statement_timeout = std::chrono::milliseconds(0);
  EXPECT_THROW(detail::build_conninfo(o), Error);
  o.statement_timeout = std::chrono::milliseconds(10);
  o.connect_timeout = std::chrono::seconds(0);
  EXPECT_THROW(detail::build_conninfo(o), Error);
}
