// The lock catalog: parsing, every kind of finding with its line, matching
// resources to classes, the hold-time lint and the rendered page.
#include <gtest/gtest.h>

#include <algorithm>

#include "jobguard/error.hpp"
#include "jobguard/job/catalog.hpp"

namespace jobguard::job {
namespace {

using namespace std::chrono_literals;

const char* kGood = R"(classes:
  - name: invoice-charge
    key: "invoice:{id}"
    owner: billing
    protects: the charge of one invoice
    consequence: moderate
    ttl: 30s
    renewal: false
    hard_timeout: none
    fencing: false
    on_redis_down: fail-closed
    fallback: stays queued
  - name: tenant-sync
    key: "tenant:{id}:sync"
    owner: integrations
    protects: one tenant's export
    consequence: high
    ttl: 20s
    renewal: true
    hard_timeout: 2h
    fencing: true
    on_redis_down: fail-open
    fallback: next night
)";

std::vector<CatalogFinding> findings_of(const std::string& yaml) {
  std::vector<CatalogFinding> f;
  Catalog::check(yaml, "cat.yaml", f);
  return f;
}

// The good catalog with one line replaced (or removed when `with` is empty).
std::string edit(const std::string& line, const std::string& with) {
  std::string s = kGood;
  const auto at = s.find(line);
  EXPECT_NE(at, std::string::npos) << line;
  const auto end = s.find('\n', at);
  s.replace(at, end - at + (with.empty() ? 1 : 0), with);
  return s;
}

TEST(Catalog, LoadsEveryFieldIntoTheLockClass) {
  const auto cat = Catalog::parse(kGood, "cat.yaml");
  ASSERT_EQ(cat.classes().size(), 2u);
  const auto& inv = cat.get("invoice-charge");
  EXPECT_EQ(inv.key_pattern, "invoice:{id}");
  EXPECT_EQ(inv.owner, "billing");
  EXPECT_EQ(inv.consequence, Consequence::moderate);
  EXPECT_EQ(inv.ttl, 30s);
  EXPECT_FALSE(inv.long_running);
  EXPECT_EQ(inv.on_redis_down, RedisDownPolicy::fail_closed);
  const auto* sync = cat.find("tenant-sync");
  ASSERT_NE(sync, nullptr);
  EXPECT_TRUE(sync->lock_class.long_running);
  EXPECT_EQ(sync->lock_class.hard_timeout, 2h);
  EXPECT_TRUE(sync->lock_class.fenced);
  EXPECT_EQ(sync->lock_class.on_redis_down, RedisDownPolicy::fail_open);
  EXPECT_EQ(sync->fallback, "next night");
  EXPECT_EQ(sync->line, 13);
}

TEST(Catalog, GetOfAnUnknownClassNamesTheClassesTheFileHas) {
  const auto cat = Catalog::parse(kGood, "cat.yaml");
  try {
    cat.get("nope");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("invoice-charge, tenant-sync"), std::string::npos) << e.what();
  }
}

TEST(Catalog, MissingFieldIsAnErrorWithFileLineAndClass) {
  const auto f = findings_of(edit("    owner: billing", ""));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].to_string(), "cat.yaml:2: error: class 'invoice-charge': missing field 'owner'");
}

TEST(Catalog, UnknownFieldIsAnErrorOnItsLine) {
  const auto f = findings_of(edit("    fencing: false", "    fencing: false\n    tll: 3s"));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].line, 11);
  EXPECT_NE(f[0].message.find("unknown field 'tll'"), std::string::npos);
}

TEST(Catalog, MalformedValuesAreErrorsOnTheirLines) {
  auto f = findings_of(edit("    ttl: 30s", "    ttl: 30 parsecs"));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].line, 7);
  EXPECT_NE(f[0].message.find("ttl"), std::string::npos) << f[0].message;
  f = findings_of(edit("    consequence: moderate", "    consequence: severe"));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_NE(f[0].message.find("expected low, moderate or high"), std::string::npos);
  f = findings_of(edit("    renewal: false", "    renewal: maybe"));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_NE(f[0].message.find("'renewal' must be true or false"), std::string::npos);
  f = findings_of(edit("    on_redis_down: fail-closed", "    on_redis_down: shrug"));
  ASSERT_EQ(f.size(), 1u);
}

TEST(Catalog, DecisionMatrixViolationsAreErrors) {
  // A renewing lease without a hard timeout.
  auto f = findings_of(edit("    hard_timeout: 2h", "    hard_timeout: none"));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].cls, "tenant-sync");
  EXPECT_NE(f[0].message.find("hard_timeout"), std::string::npos) << f[0].message;
  // A high class without fencing.
  f = findings_of(edit("    fencing: true", "    fencing: false"));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_NE(f[0].message.find("high needs fencing"), std::string::npos);
  // A hard timeout on a class that does not renew.
  f = findings_of(edit("    hard_timeout: none", "    hard_timeout: 5m"));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].cls, "invoice-charge");
}

TEST(Catalog, AClassMayDeclarePermitsOrAReadWriteMode) {
  auto cat = Catalog::parse(edit("    fencing: false", "    fencing: false\n    permits: 5"), "cat.yaml");
  EXPECT_EQ(cat.get("invoice-charge").permits, 5);
  EXPECT_EQ(cat.get("invoice-charge").mode, LockMode::mutex);
  EXPECT_EQ(cat.get("tenant-sync").permits, 0);
  cat = Catalog::parse(edit("    fencing: false", "    fencing: false\n    mode: shared"), "cat.yaml");
  EXPECT_EQ(cat.get("invoice-charge").mode, LockMode::shared);
  EXPECT_EQ(cat.get("invoice-charge").permits, 0);
  // A high class may be a writer: its advisory lock admits one holder too.
  cat = Catalog::parse(edit("    fencing: true", "    fencing: true\n    mode: exclusive"), "cat.yaml");
  EXPECT_EQ(cat.get("tenant-sync").mode, LockMode::exclusive);
  const auto md = render_markdown(cat);
  EXPECT_NE(md.find("`<prefix>:rww:{tenant:{id}:sync}`"), std::string::npos) << md;
  EXPECT_NE(md.find("- **Holders:** the writer alone"), std::string::npos) << md;
  EXPECT_NE(md.find("`<prefix>:lock:{invoice:{id}}`"), std::string::npos) << md;
}

TEST(Catalog, PermitsAndModeContradictionsAreErrorsOnTheirLines) {
  auto one = [](const std::string& yaml) {
    const auto f = findings_of(yaml);
    EXPECT_EQ(f.size(), 1u) << yaml;
    return f.empty() ? CatalogFinding{} : f[0];
  };
  const std::string after = "    fencing: false";
  for (const char* bad : {"0", "-2", "five", "2.5", "10001", "[3]"}) {
    const auto f = one(edit(after, after + "\n    permits: " + bad));
    EXPECT_EQ(f.line, 11) << bad;
    EXPECT_NE(f.message.find("expected a whole number in 1..10000"), std::string::npos) << f.message;
  }
  auto f = one(edit(after, after + "\n    mode: writer"));
  EXPECT_EQ(f.line, 11);
  EXPECT_NE(f.message.find("mode \"writer\": expected shared or exclusive"), std::string::npos) << f.message;
  f = one(edit(after, after + "\n    permits: 3\n    mode: shared"));
  EXPECT_EQ(f.cls, "invoice-charge");
  EXPECT_NE(f.message.find("permits with mode shared: a read-write lock is not a semaphore"), std::string::npos)
      << f.message;
  f = one(edit(after, after + "\n    permits: 3\n    mode: exclusive"));
  EXPECT_NE(f.message.find("permits with mode exclusive"), std::string::npos) << f.message;
  // The high row's PostgreSQL advisory lock admits one holder.
  f = one(edit("    fencing: true", "    fencing: true\n    permits: 2"));
  EXPECT_EQ(f.cls, "tenant-sync");
  EXPECT_NE(f.message.find("consequence high with permits"), std::string::npos) << f.message;
  f = one(edit("    fencing: true", "    fencing: true\n    mode: shared"));
  EXPECT_NE(f.message.find("consequence high with mode shared"), std::string::npos) << f.message;
}

TEST(Catalog, DuplicateNamesAreAnError) {
  std::string s = kGood;
  const auto at = s.find("tenant-sync");
  s.replace(at, std::string("tenant-sync").size(), "invoice-charge");
  const auto f = findings_of(s);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_NE(f[0].message.find("duplicate class name (first declared on line 2)"), std::string::npos);
}

TEST(Catalog, NotACatalogIsOneFinding) {
  EXPECT_EQ(findings_of("just: text").size(), 1u);
  EXPECT_EQ(findings_of("classes: [").size(), 1u);
  EXPECT_EQ(findings_of("classes: 3").size(), 1u);
  EXPECT_THROW(Catalog::parse("classes: 3", "x.yaml"), Error);
}

TEST(Catalog, LoadOfAMissingFileNamesIt) {
  try {
    Catalog::load("/nonexistent/catalog.yaml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/catalog.yaml"), std::string::npos);
  }
}

TEST(Catalog, MatchFindsTheClassOfAResource) {
  const auto cat = Catalog::parse(kGood, "cat.yaml");
  ASSERT_NE(cat.match("invoice:48291"), nullptr);
  EXPECT_EQ(cat.match("invoice:48291")->lock_class.name, "invoice-charge");
  EXPECT_EQ(cat.match("tenant:alpha:sync")->lock_class.name, "tenant-sync");
  EXPECT_EQ(cat.match("tenant:alpha"), nullptr);
  EXPECT_EQ(cat.match("invoice:"), nullptr);  // the id is never empty
  EXPECT_TRUE(key_pattern_matches("global:report", "global:report"));
  EXPECT_FALSE(key_pattern_matches("global:report", "global:report2"));
}

TEST(Catalog, HoldLintErrorsWhenTheTtlIsTooCloseToTheP99AndWarnsWhenFarTooLong) {
  const auto cat = Catalog::parse(kGood, "cat.yaml");
  // invoice-charge: ttl 30s; tenant-sync renews: judged by its 2 h hard timeout.
  auto f = lint_hold_times(cat, {{"invoice-charge", 27.0, 100}, {"tenant-sync", 60.0, 100}});
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].severity, CatalogFinding::Severity::error);
  EXPECT_EQ(f[0].cls, "invoice-charge");
  EXPECT_EQ(f[0].line, 2);
  EXPECT_NE(f[0].message.find("too close"), std::string::npos) << f[0].message;
  EXPECT_EQ(f[1].severity, CatalogFinding::Severity::warning);
  EXPECT_EQ(f[1].cls, "tenant-sync");
  EXPECT_NE(f[1].message.find("hard_timeout"), std::string::npos) << f[1].message;
  // Within the band: nothing. Too few samples or no numbers: nothing.
  EXPECT_TRUE(lint_hold_times(cat, {{"invoice-charge", 5.0, 100}}).empty());
  EXPECT_TRUE(lint_hold_times(cat, {{"invoice-charge", 29.0, 3}}).empty());
  EXPECT_TRUE(lint_hold_times(cat, {}).empty());
}

TEST(Catalog, ATtlAboveTheRedisMaxTtlIsAnError) {
  const auto cat = Catalog::parse(kGood, "cat.yaml");  // ttls 30s and 20s
  EXPECT_TRUE(lint_max_ttl(cat, 60s).empty());
  EXPECT_TRUE(lint_max_ttl(cat, 30s).empty());  // equal is accepted, as acquire accepts it
  EXPECT_EQ(lint_max_ttl(cat, 25s).size(), 1u);
  const auto f = lint_max_ttl(cat, 10s);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].severity, CatalogFinding::Severity::error);
  EXPECT_EQ(f[0].line, 2);
  EXPECT_NE(f[0].message.find("ttl 30s is above the lock Redis's max TTL 10s"), std::string::npos) << f[0].message;
}

TEST(Catalog, MarkdownAndHtmlDescribeEveryClassAndEscapeText) {
  std::string s = edit("    protects: the charge of one invoice", "    protects: \"<b>charges</b> | refunds\"");
  const auto cat = Catalog::parse(s, "cat.yaml");
  const auto md = render_markdown(cat);
  EXPECT_NE(md.find("## invoice-charge"), std::string::npos);
  EXPECT_NE(md.find("## tenant-sync"), std::string::npos);
  EXPECT_NE(md.find("hard timeout 2h"), std::string::npos) << md;
  EXPECT_NE(md.find("| tenant-sync | `tenant:{id}:sync` | high |"), std::string::npos) << md;
  const auto html = render_html(cat);
  EXPECT_NE(html.find("&lt;b&gt;charges&lt;/b&gt;"), std::string::npos);
  EXPECT_EQ(html.find("<b>charges"), std::string::npos);
  EXPECT_NE(html.find("<h2 id=\"tenant-sync\">"), std::string::npos);
}

TEST(Catalog, TheExampleCatalogInDocsPasses) {
  const auto cat = Catalog::load(std::string(JOBGUARD_SOURCE_DIR) + "/docs/catalog.example.yaml");
  EXPECT_GE(cat.classes().size(), 4u);
}

}  // namespace
}  // namespace jobguard::job
