// `jobguard jobs work --concurrency-per` at the binary against a real
// redis-server: the usage errors (64, before anything connects), and eight
// worker processes sharing per-key permits while one of them is killed
// (SIGKILL) mid-run. Every CMD logs its start and its end; the recorder's
// check is that no key ever had more than its limit of jobs between a start
// and its end, and that every job ran with none failed or dead-lettered.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <vector>

#include "support/cli_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string>;

class ConcurrencyCli : public CliTest {};

TEST_F(ConcurrencyCli, UsageErrorsAre64NamingTheFlagBeforeAnythingConnects) {
  struct Case {
    Args flags;
    std::string words;
  };
  const std::vector<Case> cases{
      {{"--concurrency-per", "customer=0"}, "--concurrency-per: concurrency \"customer=0\": the count must be in [1, 10000]"},
      {{"--concurrency-per", "customer=10001"}, "the count must be in [1, 10000]"},
      {{"--concurrency-per", "=2"}, "concurrency \"=2\": empty field name"},
      {{"--concurrency-per", "customer"}, "expected FIELD=N"},
      {{"--concurrency-per", "customer=two"}, "\"two\" is not a whole number"},
      {{"--concurrency-per", "customer=2.5"}, "\"2.5\" is not a whole number"},
      {{"--concurrency-per", "customer="}, "\"\" is not a whole number"},
      {{"--concurrency-per", "cust{omer}=2"}, "the field name has a brace"},
      {{"--concurrency-per", "customer=2", "--concurrency-per", "customer=3"},
       "two concurrency limits on field \"customer\""},
  };
  for (const auto& c : cases) {
    Args a{jobguard_binary(), "--redis", "redis://127.0.0.1:1/0", "jobs", "work", "--stream", key("q"), "--class", "c"};
    a.insert(a.end(), c.flags.begin(), c.flags.end());
    a.insert(a.end(), {"--", "true"});
    // A server nobody listens on: the flags are refused before a connect.
    const auto r = Subprocess(a).wait_or_kill(30s);
    EXPECT_EQ(r.status, 64) << fmt::format("{}", fmt::join(c.flags, " ")) << "\n" << r.err;
    EXPECT_NE(r.err.find(c.words), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  }
}

// Processes running the job script (their command line names `log`) whose
// ancestry reaches none of `live`: a dead worker's CMDs still running.
int orphans_of(const std::set<pid_t>& live, const std::string& log) {
  const auto parent = [](pid_t pid) -> pid_t {
    std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(st, line)) return 0;
    const auto close = line.rfind(')');
    if (close == std::string::npos) return 0;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    return state == 'Z' ? 0 : ppid;
  };
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    // read_file, not an istreambuf_iterator: a process that exits between
    // the open and the read makes the read fail (ESRCH), which the iterator
    // throws and read_file takes as an empty file.
    const std::string cmd = read_file((e.path() / "cmdline").string());
    if (cmd.find(log) == std::string::npos) continue;
    pid_t p = static_cast<pid_t>(std::stol(name));
    if (parent(p) == 0) continue;  // gone or a zombie: not running
    bool owned = false;
    for (int hops = 0; p > 1 && hops < 64 && !owned; ++hops) {
      owned = live.count(p) > 0;
      p = parent(p);
    }
    if (!owned) ++n;
  }
  return n;
}

TEST_F(ConcurrencyCli, EightWorkersOneKilledNeverRunMoreThanTheLimitOfAKeyAndLoseNoJob) {
  // The shape: 8 workers, 200 jobs over 10 keys, 2 per key.
  // JOBGUARD_CONCURRENCY_FAULT_ROUNDS=N runs it N times over (a soak).
  const char* env = std::getenv("JOBGUARD_CONCURRENCY_FAULT_ROUNDS");
  const int rounds = env ? std::max(1, std::atoi(env)) : 1;
  const int workers_n = 8, jobs = 200 * rounds, keys = 10, limit = 2;
  const std::string stream = key("q"), log = file("runs"), bin = jobguard_binary();
  for (int i = 0; i < jobs; ++i) admin(fmt::format("XADD {} * id job{} customer c{}", stream, i, i % keys));
  // --ttl 2s: the killed worker's permits come back within it, and
  // --claim-idle 1s gives its jobs to the others.
  const Args work{bin, "--redis", url(), "--json", "jobs", "work", "--stream", stream, "--class", "cc",
                  "--concurrency-per", fmt::format("customer={}", limit), "--concurrency", "4", "--ttl", "2s",
                  "--claim-idle", "1s", "--exit-when-idle", "3s", "--", "sh", "-c",
                  "echo \"+ $JOBGUARD_FIELD_CUSTOMER $JOBGUARD_FIELD_ID $(date +%s%N)\" >> \"$0\"; sleep 0.05; "
                  "echo \"- $JOBGUARD_FIELD_CUSTOMER $JOBGUARD_FIELD_ID $(date +%s%N)\" >> \"$0\"",
                  log};
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int i = 0; i < workers_n; ++i) workers.push_back(std::make_unique<Subprocess>(work));
  const auto logged = [&] {
    if (!std::filesystem::exists(log)) return 0L;
    const std::string text = read_file(log);
    return static_cast<long>(std::count(text.begin(), text.end(), '\n'));
  };
  // A crash mid-run: a fifth of the jobs logged.
  ASSERT_TRUE(eventually([&] { return logged() >= jobs * 2 / 5; }, 60s));
  workers[0]->signal(SIGKILL);
  (void)workers[0]->wait_or_kill(10s);
  // The killed worker's guardian kills its CMDs' process groups: a run of
  // it may have logged its start and never its end. Once none of its CMDs is
  // left (every process running the job script descends from a live
  // worker), such a run is over by `dead_ns` at the latest.
  std::set<pid_t> live;
  for (std::size_t i = 1; i < workers.size(); ++i) live.insert(workers[i]->pid());
  ASSERT_TRUE(eventually([&] { return orphans_of(live, log) == 0; }, 10s)) << "a killed worker's CMD outlived it";
  const long long dead_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  long long limited = 0;
  for (std::size_t i = 1; i < workers.size(); ++i) {
    const auto r = workers[i]->wait_or_kill(120s);
    ASSERT_EQ(r.status, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out.substr(r.out.rfind('{')));
    EXPECT_EQ(j.at("failed"), 0) << r.out;
    EXPECT_EQ(j.at("dead_lettered"), 0) << r.out;
    limited += j.at("concurrency_limited").get<long long>();
  }
  EXPECT_GT(limited, 0) << "no job ever waited for a permit: the limit was not exercised";
  EXPECT_EQ(admin("XLEN " + stream + ":dead"), "0");
  EXPECT_EQ(admin(fmt::format("XPENDING {} jobguard - + 10", stream)), "(array of 0)") << "jobs left pending";

  // (time, end-before-start at a tie, key, job): an end and a start logged in
  // the same nanosecond are one permit passed on, not two held at once.
  std::vector<std::tuple<long long, int, std::string, std::string>> events;
  std::set<std::string> ran;  // jobs with a run that ended
  std::istringstream in(read_file(log));
  for (std::string sign, k, id, ns; in >> sign >> k >> id >> ns;) events.emplace_back(std::stoll(ns), sign == "+" ? 1 : 0, k, id);
  std::sort(events.begin(), events.end());
  // Each end closes its job's latest open start; a start left open is a run
  // of the killed worker, counted as running until dead_ns (longer than it
  // ran: the check only gets stricter).
  std::map<std::string, std::vector<std::pair<long long, std::string>>> open;
  for (const auto& [t, start, k, id] : events) {
    if (start) open[id].emplace_back(t, k);
    else if (!open[id].empty()) {
      open[id].pop_back();
      ran.insert(id);
    }
  }
  for (const auto& [id, starts] : open)
    for (const auto& [t, k] : starts) {
      EXPECT_LT(t, dead_ns) << "job " << id << " started after the kill and never ended";
      events.emplace_back(std::max(t, dead_ns), 0, k, id);
    }
  std::sort(events.begin(), events.end());
  std::map<std::string, int> running, most;
  for (const auto& [t, start, k, id] : events) {
    running[k] += start ? 1 : -1;
    most[k] = std::max(most[k], running[k]);
  }
  EXPECT_EQ(static_cast<int>(ran.size()), jobs) << "jobs lost";
  EXPECT_EQ(static_cast<int>(most.size()), keys);
  for (const auto& [k, n] : most) EXPECT_LE(n, limit) << "key " << k << " had " << n << " jobs running at once";
}

}  // namespace
}  // namespace jobguard::test
