// `jobguard jobs add --unique` at the binary against a real redis-server:
// the usage errors (64, before anything connects), a conflict's exit status
// and words, and the fault run: producer processes enqueueing the same jobs
// over and over while workers run, are killed (SIGKILL) and paused (SIGSTOP).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "support/cli_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string>;
using nlohmann::json;

class UniqueCli : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    stream_ = key("q");
  }
  Args argv(const Args& args, const Args& globals = {}, const std::string& redis = "") const {
    Args a{jobguard_binary(), "--redis", redis.empty() ? url() : redis};
    a.insert(a.end(), globals.begin(), globals.end());
    a.push_back("jobs");
    a.insert(a.end(), args.begin(), args.end());
    return a;
  }
  SubprocessResult jobs(const Args& args, const Args& globals = {}, const std::string& redis = "") {
    Subprocess p(argv(args, globals, redis));
    return p.wait_or_kill(60s);
  }
  SubprocessResult add(const Args& flags, const std::string& fields = "id=48291") {
    Args a{"add", "--stream", stream_};
    a.insert(a.end(), flags.begin(), flags.end());
    a.push_back(fields);
    return jobs(a, {"--json"});
  }
  std::string stream_;
};

TEST_F(UniqueCli, UsageErrorsAre64NamingTheFlagBeforeAnythingConnects) {
  struct Case {
    Args flags;
    std::string words;
  };
  const std::vector<Case> cases{
      {{"--unique", "sometimes"}, "--unique \"sometimes\": expected until-executed"},
      {{"--unique", "until-executed", "--on-conflict", "shout"}, "--on-conflict \"shout\""},
      {{"--unique-for", "10s"}, "--unique-for needs --unique STRATEGY"},
      {{"--on-conflict", "log"}, "--on-conflict needs --unique STRATEGY"},
      {{"--unique", "until-expired"}, "until-expired needs --unique-for"},
      {{"--unique", "while-executing", "--unique-for", "5s"}, "while-executing takes no --unique-for"},
      {{"--unique", "while-executing", "--unique-by", "id"}, "while-executing takes no --unique-by"},
      {{"--unique", "while-executing", "--on-conflict", "replace"}, "cannot replace"},
      {{"--unique", "until-executed", "--unique-for", "0s"}, "--unique-for: must be more than 0"},
      {{"--unique", "until-executed", "--unique-for", "soon"}, "--unique-for"},
  };
  for (const auto& c : cases) {
    Args a{"add", "--stream", stream_};
    a.insert(a.end(), c.flags.begin(), c.flags.end());
    a.push_back("id=1");
    // A server nobody listens on: the flags are refused before a connect.
    const auto r = jobs(a, {}, "redis://127.0.0.1:1/0");
    EXPECT_EQ(r.status, 64) << fmt::format("{}", fmt::join(c.flags, " ")) << "\n" << r.err;
    EXPECT_NE(r.err.find(c.words), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  }
}

TEST_F(UniqueCli, AConflictIs75NamingTheHolderLogIs0AndLsShowsTheUniqueKey) {
  const auto first = add({"--unique", "until-executed"});
  ASSERT_EQ(first.status, 0) << first.err;
  const auto id = json::parse(first.out).at("id").get<std::string>();
  const auto unique_key = json::parse(first.out).at("unique_key").get<std::string>();
  EXPECT_EQ(unique_key, "{" + stream_ + "}:unique:48291");

  const auto again = add({"--unique", "until-executed"});
  EXPECT_EQ(again.status, 75) << again.err;
  EXPECT_EQ(json::parse(again.out).at("conflict"), id);
  EXPECT_NE(again.err.find("already enqueued as " + id + " (waiting)"), std::string::npos) << again.err;

  const auto logged = add({"--unique", "until-executed", "--on-conflict", "log"});
  EXPECT_EQ(logged.status, 0) << logged.err;
  EXPECT_NE(logged.err.find("nothing added (--on-conflict log)"), std::string::npos) << logged.err;
  EXPECT_EQ(admin("XLEN " + stream_), "1");

  const auto ls = jobs({"ls", "--stream", stream_}, {"--json"});
  ASSERT_EQ(ls.status, 0) << ls.err;
  const auto locks = json::parse(ls.out).at("unique_locks");
  ASSERT_EQ(locks.size(), 1u);
  EXPECT_EQ(locks[0].at("unique_key"), unique_key);
  EXPECT_EQ(locks[0].at("id"), id);
}

// 8 producer processes add the same ten jobs (until-executed) over and over,
// in the same order so that they race for one unit at a time, while three
// workers take them (each job 0.2 s of work); one worker is killed (SIGKILL) and started
// again, another paused (SIGSTOP) past its lock's TTL. Each CMD writes "run
// UNIT ID" as its last act; each producer writes "add UNIT ID" after an
// accepted add and "reject UNIT" after a conflict. The contract, read from
// that log: a unit's accepted jobs are never outstanding two at a time (each
// add of a unit comes after the run of the one before it), and every
// accepted job runs.
TEST_F(UniqueCli, UntilExecutedHoldsWhileProducersRaceAndWorkersAreKilledAndPaused) {
  const int per_producer = std::getenv("JOBGUARD_UNIQUE_FAULT_ADDS")
                               ? std::atoi(std::getenv("JOBGUARD_UNIQUE_FAULT_ADDS")) / 8
                               : 25;
  const std::string log = file("events"), bin = jobguard_binary();
  // Every unit is enqueued before any worker runs, so the producers' first
  // adds meet held locks whatever the host's speed: on a loaded host, adds
  // that each start a process came too slowly to ever meet a queued job.
  for (int u = 0; u < 10; ++u) {
    const auto r = add({"--unique", "until-executed"}, fmt::format("id={}", u));
    ASSERT_EQ(r.status, 0) << r.err;
    std::ofstream(log, std::ios::app) << fmt::format("add {} {} 0\n", u, json::parse(r.out).at("id").get<std::string>());
  }
  const std::string producer_script = fmt::format(
      R"sh(i=0; rejected=0
while [ $i -lt {n} ]; do
  u=$(( i % 10 ))
  if id=$("{bin}" --redis "{url}" jobs add --stream "{stream}" --unique until-executed id=$u 2>"{log}.err$1"); then
    echo "add $u $id 0" >> "{log}"
  else
    rc=$?; [ $rc -eq 75 ] || {{ echo "producer: exit $rc: $(cat "{log}.err$1")" >&2; exit 1; }}
    rejected=$((rejected + 1))
    echo "reject $u - 0" >> "{log}"
  fi
  i=$((i + 1))
done
echo "rejected $rejected")sh",
      fmt::arg("n", per_producer), fmt::arg("bin", bin), fmt::arg("url", url()), fmt::arg("stream", stream_),
      fmt::arg("log", log));
  std::vector<std::unique_ptr<Subprocess>> producers;
  for (int p = 0; p < 8; ++p)
    producers.push_back(std::make_unique<Subprocess>(Args{"sh", "-c", producer_script, "producer", std::to_string(p)}));
  ASSERT_TRUE(eventually([&] { return read_file(log).find("reject ") != std::string::npos; }, 60s))
      << "no producer met a held lock";

  const Args work{bin,        "--redis", url(), "jobs", "work", "--stream", stream_, "--class", "uq",
                  "--ttl",    "1s",      "--claim-idle", "500ms", "--max-attempts", "100",
                  "--unique-reap-interval", "300ms", "--concurrency", "4", "--",
                  "sh",       "-c",      "sleep 0.2; echo \"run $JOBGUARD_FIELD_ID $JOBGUARD_JOB_ID $(date +%s%N)\" >> \"$0\"", log};
  auto worker = [&] { return std::make_unique<Subprocess>(work); };
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int i = 0; i < 3; ++i) workers.push_back(worker());

  // The faults, while the producers run.
  std::this_thread::sleep_for(1s);
  workers[0]->signal(SIGKILL);
  workers[0]->wait_or_kill(10s);
  workers[1]->signal(SIGSTOP);
  std::this_thread::sleep_for(1500ms);  // past the 1 s TTL: its jobs are taken over
  workers[1]->signal(SIGCONT);
  workers[0] = worker();

  int rejected = 0;
  for (auto& p : producers) {
    const auto r = p->wait_or_kill(240s);
    ASSERT_EQ(r.status, 0) << r.err;
    rejected += std::atoi(r.out.substr(r.out.find("rejected ") + 9).c_str());
  }
  // Drain: every accepted job runs, and its lock goes, once the producers stop.
  ASSERT_TRUE(eventually([&] { return admin("SCARD {" + stream_ + "}:unique") == "0"; }, 60s))
      << "unique locks left: " << admin("SMEMBERS {" + stream_ + "}:unique");
  for (auto& w : workers) {
    w->signal(SIGTERM);
    w->wait_or_kill(20s);
  }

  // The lines of one run can come in any order (a producer writes its line
  // after its add returned; the job may have run by then), so the order is
  // read from clocks: an entry id starts with the server's wall clock in ms
  // at its XADD, and a run's line carries this machine's (the same clock)
  // when CMD ended, before the job's ack and its lock's release.
  std::istringstream in(read_file(log));
  std::map<std::string, std::set<std::string>> accepted_of;  // unit -> accepted ids
  std::map<std::string, std::pair<long long, int>> run_of;   // id -> (first end, ms; runs)
  int accepted = 0, twice = 0;
  for (std::string kind, unit, id, ns; in >> kind >> unit >> id >> ns;) {
    if (kind == "reject") continue;
    if (kind == "add") {
      ++accepted;
      accepted_of[unit].insert(id);
    } else {
      auto& [end_ms, runs] = run_of[id];
      const long long ms = std::stoll(ns) / 1000000;
      end_ms = runs == 0 ? ms : std::min(end_ms, ms);
      if (++runs == 2) ++twice;  // a paused or killed worker's job taken over
    }
  }
  const auto ms_of = [](const std::string& id) { return std::stoll(id.substr(0, id.find('-'))); };
  // Entry ids of one stream sort by their numbers, not as strings.
  const auto before = [&](const std::string& a, const std::string& b) {
    return std::pair{ms_of(a), std::stoll(a.substr(a.find('-') + 1))} <
           std::pair{ms_of(b), std::stoll(b.substr(b.find('-') + 1))};
  };
  std::vector<std::string> violations;
  int never_ran = 0;
  for (const auto& [unit, ids] : accepted_of) {
    std::vector<std::string> order(ids.begin(), ids.end());
    std::sort(order.begin(), order.end(), before);
    for (std::size_t i = 0; i < order.size(); ++i) {
      const auto r = run_of.find(order[i]);
      if (r == run_of.end()) {
        ++never_ran;
        continue;
      }
      if (i + 1 < order.size() && ms_of(order[i + 1]) < r->second.first)
        violations.push_back(fmt::format("unit {}: {} accepted before {} had run (it ended at {} ms)", unit,
                                         order[i + 1], order[i], r->second.first));
    }
  }
  for (const auto& [id, r] : run_of)
    if (std::none_of(accepted_of.begin(), accepted_of.end(), [&](const auto& u) { return u.second.count(id) > 0; }))
      violations.push_back(fmt::format("{} ran but was never accepted", id));
  EXPECT_TRUE(violations.empty()) << fmt::format("{}", fmt::join(violations, "\n"));
  EXPECT_EQ(never_ran, 0) << "accepted jobs that never ran";
  EXPECT_EQ(static_cast<int>(run_of.size()), accepted);
  EXPECT_EQ(accepted + rejected, 10 + 8 * per_producer);
  std::cout << fmt::format("unique fault run: {} adds, {} accepted, {} rejected, {} jobs run twice\n",
                           10 + 8 * per_producer, accepted, rejected, twice);
}

}  // namespace
}  // namespace jobguard::test
