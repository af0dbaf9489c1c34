// Every aggregate of the public headers, initialized by one designator as a
// user would: the members left out all have default member initializers, so
// -Wextra (-Wmissing-field-initializers) has nothing to say. A struct added
// to include/ belongs here.
#include <jobguard/jobguard.hpp>
#include <jobguard/ops/metrics_server.hpp>
#include <jobguard/testing/embedded_redis.hpp>

using namespace std::chrono_literals;

int designated_initializers() {
  using namespace jobguard;
  [[maybe_unused]] redis::TlsOptions tls{.enabled = true};
  [[maybe_unused]] redis::ConnectionOptions conn{.host = "127.0.0.1"};
  [[maybe_unused]] redis::CallOptions call{.timeout = 1s};
  [[maybe_unused]] redis::PrimaryShard shard{.address = "127.0.0.1:7000"};
  [[maybe_unused]] redis::ClientStats stats{.commands = 1};
  [[maybe_unused]] redis::Reply reply{.type = redis::Reply::Type::nil};
  [[maybe_unused]] LockOptions lock{.ttl = 30s};
  [[maybe_unused]] QuorumOptions quorum{.ttl = 10s};
  [[maybe_unused]] LeaseOptions lease{.hard_timeout = 1s};
  [[maybe_unused]] LeaseSchedulerStats lease_stats{.active = 1};
  [[maybe_unused]] guard::CompletionRecord record{.job_kind = "k"};
  [[maybe_unused]] guard::RecordOutcome outcome{.recorded = true};
  [[maybe_unused]] guard::RedisCompletionOptions completion{.retention = 24h};
  [[maybe_unused]] guard::BeginResult begin{.reclaimed = true};
  [[maybe_unused]] guard::IdempotencyOptions idem{.retention = 1h};
  [[maybe_unused]] guard::PgOptions pg{.url = "postgresql://localhost/app"};
  [[maybe_unused]] guard::PgResult pg_result{.affected_rows = 1};
  [[maybe_unused]] guard::FenceResult fence{.outcome = guard::FenceOutcome::accepted};
  [[maybe_unused]] guard::FencedUpdate update{.table = "invoices"};
  [[maybe_unused]] guard::MigrateReport migrate{.to_version = 1};
  [[maybe_unused]] job::ProcessOptions process{.argv = {"true"}};
  [[maybe_unused]] job::ExitStatus exit_status{.code = 1};
  [[maybe_unused]] job::RunnerBackends backends{.completions = nullptr};
  [[maybe_unused]] job::Unit unit{.id = "48291"};
  [[maybe_unused]] job::RunResult run{.outcome = job::Outcome::completed};
  [[maybe_unused]] job::LockClass cls{.name = "invoice-charge"};
  [[maybe_unused]] job::StreamOptions stream{.stream = "jobs"};
  [[maybe_unused]] job::StreamJob stream_job{.id = "1-0"};
  [[maybe_unused]] job::PendingEntry pending{.id = "1-0"};
  [[maybe_unused]] job::DeadLetter dead{.id = "1-0"};
  [[maybe_unused]] observe::HistogramSnapshot histogram{.count = 1};
  [[maybe_unused]] observe::LockClassSnapshot snapshot{.lock_class = "c"};
  [[maybe_unused]] observe::RegistryOptions registry{.max_classes = 1};
  [[maybe_unused]] observe::Event event{.event = "acquired"};
  [[maybe_unused]] ops::ListenAddress listen{.port = 9464};
  [[maybe_unused]] ops::MetricsServerOptions server{.read_timeout = 1s};
  [[maybe_unused]] EmbeddedRedisOptions embedded{.persistence = true};
  return 0;
}
