// The high row's durable steps in PostgreSQL: a pool of one connection per
// concurrent high-class run, the completion record in jobguard_completions,
// and the effect inside a transaction holding an advisory lock on the
// resource.
#include <fmt/format.h>

#include <mutex>
#include <vector>

#include "job/claim_path.hpp"
#include "jobguard/guard/postgres.hpp"
#include "jobguard/job/runner.hpp"

namespace jobguard::job {
namespace {

constexpr std::string_view kSelectDone =
    "SELECT result FROM jobguard_completions WHERE job_kind = $1 AND entity = $2 AND run_id = $3";
constexpr std::string_view kInsertDone =
    "INSERT INTO jobguard_completions (job_kind, entity, run_id, completed_by, result) VALUES ($1, $2, $3, $4, $5)";

// Thrown inside the transaction to roll it back with a verdict that is not
// an error of the effect.
struct Busy {
  std::string detail;
};

class PgSteps final : public DurableSteps {
 public:
  explicit PgSteps(guard::PgOptions options) : options_(std::move(options)) {}

  std::optional<std::string> find(const ClaimCall& c, const std::string& run_id) override {
    // A connection whose statement failed is dropped, not given back.
    auto conn = take();
    auto rows = conn->exec(kSelectDone, {c.cls->name, c.resource, run_id});
    give(std::move(conn));
    if (rows.empty()) return std::nullopt;
    return rows.rows[0][0].value_or("");
  }

  void record(const ClaimCall& c, const std::string& run_id, const std::string& worker,
              const std::string& result) override {
    auto conn = take();
    // ON CONFLICT: a chunked unit's final record may race a fail-open twin;
    // either record proves the same thing.
    conn->exec(std::string(kInsertDone) + " ON CONFLICT DO NOTHING", {c.cls->name, c.resource, run_id, worker, result});
    give(std::move(conn));
  }

  Step transact(const ClaimCall& c, const std::string& run_id, const std::string& worker,
                const std::function<std::string(guard::PgTransaction&)>& effect) override {
    const LockClass& cls = *c.cls;
    auto conn = take();
    Step out;
    try {
      conn->transact([&](guard::PgTransaction& tx) {
        // The durable guard: one transaction per resource at a time, whatever
        // Redis says (it may have lost the lock, or be down and fail-open).
        const std::string name = cls.name + "/" + c.resource;
        const bool got = cls.wait.count() > 0 ? tx.advisory_xact_lock(name, cls.wait) : tx.try_advisory_xact_lock(name);
        if (!got) throw Busy{fmt::format("advisory lock {} is held by another transaction", name)};
        auto res = tx.exec(kSelectDone, {cls.name, c.resource, run_id});
        if (!res.empty()) {
          out.kind = Step::Kind::done;
          out.result = res.rows[0][0].value_or("");
          return;
        }
        out.result = effect(tx);
        // The record commits with the effect's writes, or neither does.
        tx.exec(kInsertDone, {cls.name, c.resource, run_id, worker, out.result});
      });
    } catch (const Busy& b) {
      give(std::move(conn));
      return Step{Step::Kind::busy, {}, b.detail};
    } catch (const Error& e) {
      // A connection that failed mid-transaction is not reused.
      if (e.code() != make_error_code(errc::postgres_unavailable) && e.code() != make_error_code(errc::in_doubt))
        give(std::move(conn));
      throw;
    } catch (...) {
      give(std::move(conn));
      throw;
    }
    give(std::move(conn));
    return out;
  }

 private:
  std::unique_ptr<guard::PgConnection> take() {
    {
      std::lock_guard lk(mu_);
      if (!idle_.empty()) {
        auto c = std::move(idle_.back());
        idle_.pop_back();
        return c;
      }
    }
    return std::make_unique<guard::PgConnection>(options_);
  }
  void give(std::unique_ptr<guard::PgConnection> c) {
    std::lock_guard lk(mu_);
    idle_.push_back(std::move(c));
  }

  guard::PgOptions options_;
  std::mutex mu_;
  std::vector<std::unique_ptr<guard::PgConnection>> idle_;
};

}  // namespace

std::unique_ptr<DurableSteps> make_pg_steps(const RunnerBackends& b) {
  return std::make_unique<PgSteps>(*b.postgres);
}

}  // namespace jobguard::job
