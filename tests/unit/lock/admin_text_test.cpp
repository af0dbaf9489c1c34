// What `jobguard locks` prints, from LockInfo snapshots alone (no server):
// the columns, the age rule for unfenced classes, and the JSON fields.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "jobguard/admin.hpp"

namespace jobguard::admin {
namespace {

using namespace std::chrono_literals;

LockInfo held(std::string resource, std::string holder, std::optional<std::int64_t> fence,
              std::optional<std::chrono::milliseconds> age) {
  LockInfo i;
  i.key = "jobguard:lock:{" + resource + "}";
  i.resource = std::move(resource);
  i.held = true;
  i.holder = std::move(holder);
  i.ttl_left = 28800ms;
  i.fence = fence;
  i.fence_age = age;
  return i;
}

ListResult two_locks() {
  ListResult r;
  r.locks.push_back(held("invoice:48291", "vm/26865/invoice-run", 1796099349073206, 1200ms));
  r.locks.push_back(held("tenant:acme:sync", "vm/26866/nightly", 1796099349000000, 900ms));
  r.stats.scan_calls = 1;
  r.stats.keys_matched = 2;
  return r;
}

TEST(AdminText, TheTableAlignsItsColumnsAndCountsTheScanRoundTrips) {
  const auto t = format_list(two_locks());
  // Each column as wide as its longest cell, two spaces apart.
  EXPECT_EQ(t.substr(0, t.rfind("2 locks")),
            "RESOURCE          HOLDER                AGE    TTL_LEFT  FENCE             WAITERS\n"
            "invoice:48291     vm/26865/invoice-run  1.2s   28.8s     1796099349073206  0\n"
            "tenant:acme:sync  vm/26866/nightly      900ms  28.8s     1796099349000000  0\n")
      << t;
  EXPECT_NE(t.find("\n2 locks (1 SCAN round trip)\n"), std::string::npos) << t;
}

TEST(AdminText, AnUnfencedClassShowsNoAgeAndTheClassColumnAppearsWithACatalog) {
  // The tenant class is declared unfenced: its resource's fence belongs to an
  // earlier fenced grant, so the age is not this holder's.
  const ClassOf class_of = [](std::string_view r) -> std::optional<ClassTag> {
    if (r.rfind("tenant:", 0) == 0) return ClassTag{"tenant-sync", false};
    return std::nullopt;
  };
  const auto t = format_list(two_locks(), class_of);
  EXPECT_NE(t.find("WAITERS  CLASS\n"), std::string::npos) << t;
  EXPECT_NE(t.find("1.2s"), std::string::npos) << t;
  EXPECT_EQ(t.find("900ms"), std::string::npos) << t;
  EXPECT_NE(t.find("  tenant-sync\n"), std::string::npos) << t;
  EXPECT_NE(t.find("  -\n"), std::string::npos) << t;  // invoice matches no class

  const auto j = nlohmann::json::parse(list_json(two_locks(), class_of));
  EXPECT_EQ(j.at("locks").size(), 2u);
  EXPECT_TRUE(j["locks"][0].at("class").is_null());
  EXPECT_EQ(j["locks"][1].at("class"), "tenant-sync");
  EXPECT_EQ(j["locks"][0].at("fence_age_ms"), 1200);
  EXPECT_EQ(j.at("scan_calls"), 1);
  // Without a catalog there is no class field at all.
  EXPECT_FALSE(nlohmann::json::parse(list_json(two_locks())).at("locks")[0].contains("class"));
}

TEST(AdminText, ShowReleaseAndAuditLines) {
  LockInfo free;
  free.resource = "inv:2";
  free.key = "jobguard:lock:{inv:2}";
  EXPECT_NE(format_info(free).find("holder    (none: not held)\n"), std::string::npos);
  EXPECT_NE(format_info(free).find("fence     (none issued)\n"), std::string::npos);

  ForceReleaseResult r;
  r.outcome = ForceReleaseResult::Outcome::released;
  r.holder = "vm/1/x";
  r.ttl_left = 28619ms;
  r.new_fence = 42;
  r.audit_id = "1796099350454-0";
  EXPECT_EQ(format_release("invoice:1", r, ""),
            "released invoice:1 (holder vm/1/x, 28.6s left); fence advanced to 42; audit entry 1796099350454-0\n");
  const auto j = nlohmann::json::parse(release_json("invoice:1", r));
  EXPECT_EQ(j.at("outcome"), "released");
  EXPECT_EQ(j.at("fence"), 42);
  r.outcome = ForceReleaseResult::Outcome::holder_changed;
  r.holder = "web-9/77/new";
  EXPECT_EQ(format_release("invoice:1", r, "web-3/12/old"),
            "invoice:1 is held by web-9/77/new, not web-3/12/old: nothing released\n");
  EXPECT_FALSE(nlohmann::json::parse(release_json("invoice:1", r)).contains("fence"));

  AuditRecord a;
  a.id = "1796099350454-0";
  a.at_ms = 1796099350454;
  a.resource = "invoice:48291";
  a.who = "ops@vm";
  a.holder = "vm/26865/invoice-run";
  a.ttl_left_ms = 28619;
  a.fence = 1796099350454922;
  a.reason = "web-3 is dead";
  EXPECT_EQ(format_audit({a}),
            "2026-12-01T04:29:10.454Z  invoice:48291  by ops@vm  removed vm/26865/invoice-run (28619 ms left), "
            "fence -> 1796099350454922: web-3 is dead\n");
  EXPECT_EQ(format_audit({}), "no force releases recorded\n");
  EXPECT_EQ(nlohmann::json::parse(audit_json({a})).at("releases")[0].at("reason"), "web-3 is dead");
}

TEST(AdminText, AuditShowsOtherActionsByName) {
  AuditRecord a;
  a.at_ms = 1796099350454;
  a.action = "retry_dead_letter";
  a.resource = "billing-jobs";
  a.job = "1-1 -> 2-0";
  a.who = "ops@vm via dashboard";
  a.reason = "card fixed";
  EXPECT_EQ(format_audit({a}),
            "2026-12-01T04:29:10.454Z  billing-jobs  by ops@vm via dashboard  retry_dead_letter 1-1 -> 2-0: card fixed\n");
  const auto j = nlohmann::json::parse(audit_json({a})).at("releases")[0];
  EXPECT_EQ(j.at("action"), "retry_dead_letter");
  EXPECT_EQ(j.at("job"), "1-1 -> 2-0");
}

TEST(AdminText, AResourceOrItsLockKeyNameTheSameLock) {
  const KeyBuilder keys("jobguard");
  EXPECT_EQ(parse_resource(keys, "invoice:1"), "invoice:1");
  EXPECT_EQ(parse_resource(keys, "jobguard:lock:{invoice:1}"), "invoice:1");
  EXPECT_THROW(parse_resource(keys, "bad key"), Error);
}

}  // namespace
}  // namespace jobguard::admin
