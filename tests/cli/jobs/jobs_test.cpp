// `jobguard jobs` as operators run it: the real binary against a real
// redis-server per test; `work` runs real CMD processes that append to a file,
// which is the ground truth for "ran exactly once".
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "jobguard/redis/client.hpp"
#include "support/cli_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string>;
using nlohmann::json;

class JobsCli : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    stream_ = key("q");
  }

  // jobguard --redis URL [globals] jobs SUB ARGS
  Args argv(const std::string& sub, const Args& args, const Args& globals = {}) const {
    Args a{jobguard_binary(), "--redis", url()};
    a.insert(a.end(), globals.begin(), globals.end());
    a.push_back("jobs");
    a.push_back(sub);
    a.insert(a.end(), args.begin(), args.end());
    return a;
  }
  SubprocessResult jobs(const std::string& sub, const Args& args, const Args& globals = {}) {
    Subprocess p(argv(sub, args, globals));
    return p.wait_or_kill(60s);
  }
  json jobs_json(const std::string& sub, const Args& args) {
    const auto r = jobs(sub, args, {"--json"});
    EXPECT_EQ(r.status, 0) << r.err;
    return json::parse(r.out);
  }
  std::string add(const Args& fields) {
    Args a{"--stream", stream_};
    a.insert(a.end(), fields.begin(), fields.end());
    return jobs_json("add", a).at("id").get<std::string>();
  }
  // `work` flags for this test's stream, then `-- CMD`.
  Args work_args(const Args& flags, const Args& cmd) const {
    Args a{"--stream", stream_, "--class", "t"};
    a.insert(a.end(), flags.begin(), flags.end());
    a.push_back("--");
    a.insert(a.end(), cmd.begin(), cmd.end());
    return a;
  }
  // CMD that appends "<prefix><job's id field>" to `out`.
  Args append_id(const std::string& out, const std::string& prefix = "") const {
    return {"sh", "-c", "echo \"$1$JOBGUARD_FIELD_ID\" >> \"$0\"", out, prefix};
  }
  std::vector<std::string> lines(const std::string& path) const {
    std::vector<std::string> out;
    std::istringstream in(read_file(path));
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }
  bool exists(const std::string& path) const { return std::filesystem::exists(path); }

  std::string stream_;
};

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

int count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (auto at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++n;
  return n;
}

TEST_F(JobsCli, AddThenLsShowsTheJobAndItsPendingDelivery) {
  const auto id = add({"id=42", "note=[a,b] c"});
  EXPECT_EQ(admin("XLEN " + stream_), "1");
  // Fields are stored as typed (CLI11 must not split "[a,b]").
  {
    auto client = make_client();
    const auto r = client->exec(redis::Command{"XRANGE", stream_, "-", "+"});
    ASSERT_EQ(r.elements.size(), 1u);
    const auto& f = r.elements[0].elements[1].elements;
    ASSERT_EQ(f.size(), 4u);
    EXPECT_EQ(f[0].str, "id");
    EXPECT_EQ(f[1].str, "42");
    EXPECT_EQ(f[2].str, "note");
    EXPECT_EQ(f[3].str, "[a,b] c");
  }

  auto ls = jobs_json("ls", {"--stream", stream_});
  EXPECT_EQ(ls.at("length"), 1);
  EXPECT_EQ(ls.at("pending"), 0);
  EXPECT_EQ(ls.at("dead_letter_length"), 0);
  EXPECT_EQ(ls.at("dead_letter_stream"), stream_ + ":dead");
  EXPECT_TRUE(ls.at("pending_entries").empty());

  // A consumer reads it without acknowledging: it is pending, held by that consumer.
  admin("XREADGROUP GROUP jobguard c1 COUNT 1 STREAMS " + stream_ + " >");
  ls = jobs_json("ls", {"--stream", stream_});
  EXPECT_EQ(ls.at("pending"), 1);
  ASSERT_EQ(ls.at("pending_entries").size(), 1u);
  const auto& e = ls.at("pending_entries")[0];
  EXPECT_EQ(e.at("id"), id);
  EXPECT_EQ(e.at("consumer"), "c1");
  EXPECT_EQ(e.at("deliveries"), 1);
  EXPECT_GE(e.at("idle_ms").get<std::int64_t>(), 0);

  const auto human = jobs("ls", {"--stream", stream_});
  EXPECT_EQ(human.status, 0) << human.err;
  EXPECT_NE(human.out.find(id), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("c1"), std::string::npos) << human.out;
}

TEST_F(JobsCli, LsOfAStreamWithoutTheGroupDoesNotCreateIt) {
  auto ls = jobs_json("ls", {"--stream", stream_});
  EXPECT_EQ(ls.at("group_exists"), false);
  EXPECT_EQ(ls.at("length"), 0);
  EXPECT_EQ(admin("EXISTS " + stream_), "0");
}

TEST_F(JobsCli, MalformedFieldIsAUsageErrorNamingIt) {
  for (const std::string bad : {"novalue", "=v"}) {
    const auto r = jobs("add", {"--stream", stream_, "ok=1", bad});
    EXPECT_EQ(r.status, 64) << bad << ": " << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("\"" + bad + "\""), std::string::npos) << r.err;
  }
  EXPECT_EQ(admin("EXISTS " + stream_), "0");  // nothing was added
}

TEST_F(JobsCli, WorkUsageErrorsAre64NamingTheProblem) {
  struct Case {
    Args args;
    std::string names;
  };
  const std::vector<Case> cases{
      {{"--stream", stream_, "--class", "t", "--consequence", "severe", "--", "true"}, "--consequence"},
      {{"--stream", stream_, "--class", "t", "--on-redis-down", "maybe", "--", "true"}, "--on-redis-down"},
      {{"--stream", stream_, "--", "true"}, "--class"},
      {{"--class", "t", "--", "true"}, "--stream"},
      {{"--stream", stream_, "--class", "t"}, "CMD"},
      {{"--stream", stream_, "--class", "t", "--claim-idle", "soon", "--", "true"}, "--claim-idle"},
  };
  for (const auto& c : cases) {
    const auto r = jobs("work", c.args);
    EXPECT_EQ(r.status, 64) << c.names << ": " << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(c.names), std::string::npos) << r.err;
  }
}

// A class TTL the URL's max_ttl refuses: every acquire would refuse it, so
// the worker refuses to start, before it reads a job. (The hazard: an
// exception thrown inside an awaited operation's start escapes to
// io_context::run and aborts the process from its event loop.)
TEST_F(JobsCli, WorkWithATtlAboveTheMaxTtlIs64BeforeAnyJobIsTaken) {
  add({"id=1"});
  Subprocess p({jobguard_binary(), "--redis", url() + "?max_ttl=2s", "jobs", "work", "--stream", stream_, "--class",
                "t", "--ttl", "5s", "--max-jobs", "1", "--", "true"});
  const auto r = p.wait_or_kill(60s);
  EXPECT_EQ(r.status, 64) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("ttl 5000 ms is above the max TTL 2000 ms"), std::string::npos) << r.err;
  // The job was not taken: nothing pending, nothing dead-lettered.
  const auto ls = jobs_json("ls", {"--stream", stream_});
  EXPECT_EQ(ls.at("length").get<int>(), 1) << ls.dump();
  EXPECT_EQ(ls.at("pending").get<int>(), 0) << ls.dump();
  EXPECT_EQ(ls.at("dead_letter_length").get<int>(), 0) << ls.dump();
}

TEST_F(JobsCli, UnreachableRedisIs69) {
  const auto marker = file("ran");
  server->stop();
  for (const auto& [sub, args] : std::vector<std::pair<std::string, Args>>{
           {"add", {"--stream", "q", "id=1"}},
           {"ls", {"--stream", "q"}},
           {"dead", {"--stream", "q"}},
           {"retry", {"--stream", "q", "--all"}},
           {"work", work_args({}, {"sh", "-c", "echo > " + marker})}}) {
    const auto r = jobs(sub, args);
    EXPECT_EQ(r.status, 69) << sub << ": " << r.err;
    EXPECT_NE(r.err.find("cannot reach Redis"), std::string::npos) << r.err;
  }
  EXPECT_FALSE(exists(marker));
}

TEST_F(JobsCli, WorkersRunEachJobExactlyOnceAndSeeTheirEnvironment) {
  const auto out = file("out");
  for (int i = 1; i <= 10; ++i) add({fmt::format("id={}", i), "run=2026-11"});
  // Two workers share the stream; each job runs once, in one of them.
  Subprocess a(argv("work", work_args({"--consumer", "a", "--exit-when-idle", "1s"}, append_id(out)), {"--json"}));
  Subprocess b(argv("work", work_args({"--consumer", "b", "--exit-when-idle", "1s"}, append_id(out)), {"--json"}));
  const auto ra = a.wait_or_kill(60s);
  const auto rb = b.wait_or_kill(60s);
  ASSERT_EQ(ra.status, 0) << ra.err;
  ASSERT_EQ(rb.status, 0) << rb.err;
  auto got = lines(out);
  std::sort(got.begin(), got.end(), [](const auto& x, const auto& y) { return std::stoi(x) < std::stoi(y); });
  std::vector<std::string> want;
  for (int i = 1; i <= 10; ++i) want.push_back(std::to_string(i));
  EXPECT_EQ(got, want);
  EXPECT_EQ(json::parse(ra.out).at("completed").get<int>() + json::parse(rb.out).at("completed").get<int>(), 10);
  EXPECT_EQ(jobs_json("ls", {"--stream", stream_}).at("pending"), 0);

  // The environment CMD sees.
  const auto env = file("env");
  const auto id = add({"id=77", "run=r1", "odd-name.x=v"});
  const auto r = jobs("work", work_args({"--max-jobs", "1", "--consequence", "low"},
                                        {"sh", "-c",
                                         "printf '%s\\n' \"$JOBGUARD_JOB_ID\" \"$JOBGUARD_KEY\" "
                                         "\"$JOBGUARD_IDEMPOTENCY_KEY\" \"$JOBGUARD_FIELD_ODD_NAME_X\" "
                                         "\"${JOBGUARD_FENCE-unset}\" > \"$0\"",
                                         env}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(lines(env), (std::vector<std::string>{id, "jobguard:lock:{t:77}", "t/t:77/r1", "v", "unset"}));

  add({"id=78"});
  const auto fenced = jobs("work", work_args({"--max-jobs", "1", "--fence"},
                                             {"sh", "-c", "echo \"$JOBGUARD_FENCE\" > \"$0\"", env}));
  ASSERT_EQ(fenced.status, 0) << fenced.err;
  const auto fence = lines(env);
  ASSERT_EQ(fence.size(), 1u);
  EXPECT_GT(std::stoll(fence[0]), 0);

  // A catalog class with permits: CMD holds one of them and is told N, its
  // slot (the only holder: slot 0) and the fence that goes with it.
  const auto cat = file("catalog.yaml");
  std::ofstream(cat) << R"(classes:
  - {name: t, key: "t:{id}", owner: o, protects: p, consequence: low, ttl: 7s, renewal: false,
     hard_timeout: none, fencing: true, on_redis_down: fail-closed, fallback: f, permits: 3}
)";
  add({"id=79"});
  const auto permit = jobs("work", work_args({"--max-jobs", "1", "--catalog", cat},
                                             {"sh", "-c",
                                              "printf '%s\\n' \"$JOBGUARD_KEY\" \"$JOBGUARD_PERMITS\" "
                                              "\"$JOBGUARD_PERMIT_SLOT\" \"${JOBGUARD_FENCE-unset}\" > \"$0\"",
                                              env}));
  ASSERT_EQ(permit.status, 0) << permit.err;
  const auto told = lines(env);
  ASSERT_EQ(told.size(), 4u);
  EXPECT_EQ(told[0], "jobguard:sem:{t:79}");
  EXPECT_EQ(told[1], "3");
  EXPECT_EQ(told[2], "0");
  EXPECT_GT(std::stoll(told[3]), 0);

  // A count changed at run time (set_permits stores it beside the
  // semaphore): the grant is made under it, and CMD is told that one, not
  // the catalog's.
  admin("SET jobguard:permits:{t:80} 5");
  add({"id=80"});
  const auto changed = jobs("work", work_args({"--max-jobs", "1", "--catalog", cat},
                                              {"sh", "-c", "printf '%s\\n' \"$JOBGUARD_PERMITS\" > \"$0\"", env}));
  ASSERT_EQ(changed.status, 0) << changed.err;
  EXPECT_EQ(lines(env), (std::vector<std::string>{"5"}));
}

TEST_F(JobsCli, MaxJobsStopsAfterNFinishedJobs) {
  const auto out = file("out");
  for (int i = 1; i <= 3; ++i) add({fmt::format("id={}", i)});
  const auto r = jobs("work", work_args({"--max-jobs", "2"}, append_id(out)), {"--log-format", "json"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(lines(out), (std::vector<std::string>{"1", "2"}));
  EXPECT_EQ(count(r.err, "\"event\":\"job\""), 2) << r.err;  // one line per job
  EXPECT_EQ(admin("XLEN " + stream_), "3");
  EXPECT_EQ(jobs_json("ls", {"--stream", stream_}).at("pending"), 0);  // the third was never read
}

TEST_F(JobsCli, StalledJobIsReclaimedAfterItsWorkerIsKilled) {
  const auto out = file("out"), started = file("started");
  add({"id=5"});
  // Worker A takes the job; its CMD records its pid, then hangs.
  Subprocess a(argv("work", work_args({"--consumer", "A", "--ttl", "1s"},
                                      {"sh", "-c",
                                       "echo $$ > \"$0.tmp\"; mv \"$0.tmp\" \"$0\"; sleep 30; echo \"A$JOBGUARD_FIELD_ID\" >> \"$1\"",
                                       started, out})));
  ASSERT_TRUE(eventually([&] { return exists(started); }, 20s)) << a.err();
  const pid_t cmd = std::stoi(read_file(started));
  // A dies without a word; its CMD's guardian kills CMD's group with it, or CMD
  // would finish the job behind the test's back.
  a.signal(SIGKILL);
  a.wait_or_kill(10s);
  ASSERT_TRUE(eventually([&] { return process_gone(cmd); }, 10s)) << "CMD " << cmd << " outlived its worker";
  EXPECT_EQ(jobs_json("ls", {"--stream", stream_}).at("pending_entries")[0].at("consumer"), "A");

  // B takes it over once it has been idle for --claim-idle; A's lock expires
  // by its TTL (B meanwhile finds it busy and leaves the job pending).
  const auto r = jobs("work", work_args({"--consumer", "B", "--ttl", "1s", "--claim-idle", "300ms", "--max-attempts",
                                         "50", "--max-jobs", "1"},
                                        append_id(out, "B")),
                      {"--log-format", "json"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(lines(out), std::vector<std::string>{"B5"});
  EXPECT_NE(r.err.find("\"reclaimed\":true"), std::string::npos) << r.err;
  const auto ls = jobs_json("ls", {"--stream", stream_});
  EXPECT_EQ(ls.at("pending"), 0);
  EXPECT_EQ(ls.at("dead_letter_length"), 0);
}

TEST_F(JobsCli, FailingJobIsDeadLetteredAfterMaxAttemptsWithItsLastError) {
  const auto out = file("out");
  const auto id = add({"id=7", "what=refund"});
  const auto r = jobs("work", work_args({"--max-attempts", "2", "--claim-idle", "200ms", "--max-jobs", "1"},
                                        {"sh", "-c", "echo \"$JOBGUARD_FIELD_ID\" >> \"$0\"; exit 3", out}),
                      {"--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(lines(out), (std::vector<std::string>{"7", "7"}));  // two attempts, then no more
  const auto summary = json::parse(r.out);
  EXPECT_EQ(summary.at("failed"), 2);
  EXPECT_EQ(summary.at("dead_lettered"), 1);

  const auto dead = jobs_json("dead", {"--stream", stream_});
  ASSERT_EQ(dead.at("entries").size(), 1u);
  const auto& d = dead.at("entries")[0];
  EXPECT_EQ(d.at("source_id"), id);
  EXPECT_EQ(d.at("last_error"), "exit status 3");
  EXPECT_EQ(d.at("attempts"), 2);
  EXPECT_EQ(d.at("fields"), (json{{"id", "7"}, {"what", "refund"}}));
  const auto ls = jobs_json("ls", {"--stream", stream_});
  EXPECT_EQ(ls.at("pending"), 0);
  EXPECT_EQ(ls.at("dead_letter_length"), 1);

  const auto human = jobs("dead", {"--stream", stream_});
  EXPECT_NE(human.out.find("exit status 3"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("what=refund"), std::string::npos) << human.out;
}

TEST_F(JobsCli, RetryPutsDeadLettersBackAndTheJobRunsAgain) {
  const auto out = file("out");
  add({"id=1"});
  add({"id=2"});
  const auto failing = work_args({"--max-attempts", "1", "--max-jobs", "2"},
                                 {"sh", "-c", "echo \"$JOBGUARD_FIELD_ID\" >> \"$0\"; exit 3", out});
  ASSERT_EQ(jobs("work", failing).status, 0);
  const auto dead = jobs_json("dead", {"--stream", stream_}).at("entries");
  ASSERT_EQ(dead.size(), 2u);
  const std::string newest = dead[0].at("id"), oldest = dead[1].at("id");

  // One by id: back on the stream with its own fields, gone from the dead letters.
  const auto one = jobs_json("retry", {"--stream", stream_, newest});
  ASSERT_EQ(one.at("retried").size(), 1u) << one.dump();
  EXPECT_EQ(one.at("retried")[0].at("dead_id"), newest);
  EXPECT_TRUE(one.at("missing").empty());
  EXPECT_EQ(admin("XLEN " + stream_ + ":dead"), "1");
  EXPECT_EQ(admin("XLEN " + stream_), "3");

  // The same id again is not there any more: 65, naming it; nothing changes.
  const auto again = jobs("retry", {"--stream", stream_, newest});
  EXPECT_EQ(again.status, 65) << again.err;
  EXPECT_NE(again.err.find("not in " + stream_ + ":dead: " + newest), std::string::npos) << again.err;
  EXPECT_EQ(count_lines(again.err), 1) << again.err;
  EXPECT_EQ(admin("XLEN " + stream_), "3");

  // --all takes the rest; the retried jobs run again and succeed.
  const auto all = jobs("retry", {"--stream", stream_, "--all"});
  ASSERT_EQ(all.status, 0) << all.err;
  EXPECT_NE(all.out.find(oldest + " -> "), std::string::npos) << all.out;
  EXPECT_EQ(admin("XLEN " + stream_ + ":dead"), "0");
  const auto ok = work_args({"--max-jobs", "2"}, append_id(out, "ok"));
  ASSERT_EQ(jobs("work", ok).status, 0);
  auto ran = lines(out);
  std::sort(ran.begin(), ran.end());
  EXPECT_EQ(ran, (std::vector<std::string>{"1", "2", "ok1", "ok2"}));
  EXPECT_EQ(jobs_json("ls", {"--stream", stream_}).at("pending"), 0);

  // Nothing left: --all says so and succeeds.
  const auto none = jobs("retry", {"--stream", stream_, "--all"});
  EXPECT_EQ(none.status, 0) << none.err;
  EXPECT_NE(none.out.find("no dead letters"), std::string::npos) << none.out;
}

TEST_F(JobsCli, RetryUsageErrorsAre64) {
  for (const Args& args : {Args{"--stream", stream_}, Args{"--stream", stream_, "--all", "1-1"},
                           Args{"--stream", stream_, "--all", "--count", "0"}}) {
    const auto r = jobs("retry", args);
    EXPECT_EQ(r.status, 64) << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
  }
}

TEST_F(JobsCli, CompletedJobDeliveredAgainIsSkipped) {
  const auto out = file("out");
  add({"id=9", "run=2026-11"});
  auto r = jobs("work", work_args({"--max-jobs", "1"}, append_id(out)));
  ASSERT_EQ(r.status, 0) << r.err;
  // The producer sends it again (a retry, a replayed stream): same unit, same run.
  add({"id=9", "run=2026-11"});
  r = jobs("work", work_args({"--max-jobs", "1"}, append_id(out)), {"--json", "--log-format", "json"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(lines(out), std::vector<std::string>{"9"});  // ran once
  EXPECT_EQ(json::parse(r.out).at("skipped"), 1);
  EXPECT_NE(r.err.find("\"event\":\"skipped\""), std::string::npos) << r.err;
  EXPECT_EQ(jobs_json("ls", {"--stream", stream_}).at("pending"), 0);  // acknowledged

  // A new run of the same unit does run.
  add({"id=9", "run=2026-12"});
  r = jobs("work", work_args({"--max-jobs", "1"}, append_id(out)));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(lines(out), (std::vector<std::string>{"9", "9"}));
}

TEST_F(JobsCli, JobWithoutIdFieldFailsWithThatError) {
  add({"name=x"});
  const auto r = jobs("work", work_args({"--max-attempts", "1", "--max-jobs", "1"}, {"true"}));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto dead = jobs_json("dead", {"--stream", stream_});
  ASSERT_EQ(dead.at("entries").size(), 1u);
  EXPECT_EQ(dead.at("entries")[0].at("last_error"), "job has no field \"id\"");
}

// A CMD that outlives its lock would run beside the next holder: it is stopped
// when the lease's hard timeout passes, or when a plain lock's TTL runs out.
TEST_F(JobsCli, CmdOutlivingItsLockIsStoppedAndTheJobStaysPending) {
  struct Case {
    Args flags;
    std::string outcome;
  };
  const std::vector<Case> cases{
      {{"--timeout", "300ms"}, "timed_out"},
      {{"--consequence", "low", "--ttl", "300ms"}, "lease_lost"},
  };
  for (const auto& c : cases) {
    const auto out = file("out-" + c.outcome);
    add({"id=" + c.outcome});
    Args flags{"--grace", "100ms", "--exit-when-idle", "300ms"};
    flags.insert(flags.end(), c.flags.begin(), c.flags.end());
    const auto r = jobs("work", work_args(flags, {"sh", "-c", "sleep 30; echo done >> \"$0\"", out}),
                        {"--log-format", "json"});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("\"outcome\":\"" + c.outcome + "\""), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("\"action\":\"left_pending\""), std::string::npos) << r.err;
    EXPECT_FALSE(exists(out));
  }
  const auto ls = jobs_json("ls", {"--stream", stream_});
  EXPECT_EQ(ls.at("pending"), 2);
  EXPECT_EQ(ls.at("dead_letter_length"), 0);
}

TEST_F(JobsCli, SigtermStopsTheWorkerAndItsCmdAndLeavesTheJobPending) {
  const auto started = file("started"), out = file("out");
  add({"id=3"});
  Subprocess w(argv("work", work_args({"--grace", "5s"},
                                      {"sh", "-c",
                                       "echo $$ > \"$0.tmp\"; mv \"$0.tmp\" \"$0\"; sleep 30; echo done >> \"$1\"",
                                       started, out})));
  ASSERT_TRUE(eventually([&] { return exists(started); }, 20s)) << w.err();
  const pid_t cmd = std::stoi(read_file(started));
  w.signal(SIGTERM);
  const auto r = w.wait_or_kill(30s);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(eventually([&] { return process_gone(cmd); }, 10s));
  EXPECT_FALSE(exists(out));
  const auto ls = jobs_json("ls", {"--stream", stream_});
  EXPECT_EQ(ls.at("pending"), 1);  // comes back to another worker after claim-idle
  EXPECT_EQ(ls.at("dead_letter_length"), 0);
}

}  // namespace
}  // namespace jobguard::test

namespace jobguard::test {
namespace {

// --concurrency N: N CMDs at once from one worker process, each job's CMD once.
TEST_F(JobsCli, ConcurrentWorkerRunsCmdsAtOnceAndEachJobOnce) {
  const auto out = file("out"), running = file("running");
  constexpr int kJobs = 12;
  for (int i = 0; i < kJobs; ++i) add({"id=" + std::to_string(i % 6), "run=r" + std::to_string(i / 6)});
  // Each CMD notes its start in `running`, waits until four have started
  // (giving up after 1,000 looks), then appends its unit and how many had
  // started: with four slots, the first four saw each other.
  const Args cmd{"sh", "-c",
                 "echo x >> \"$1\"; i=0; while [ $(wc -l < \"$1\") -lt 4 ] && [ $i -lt 1000 ]; do sleep 0.01; "
                 "i=$((i+1)); done; echo \"$JOBGUARD_FIELD_ID/$JOBGUARD_FIELD_RUN $(wc -l < \"$1\")\" >> \"$0\"",
                 out, running};
  const auto r = jobs("work", work_args({"--concurrency", "4", "--max-jobs", std::to_string(kJobs)}, cmd), {"--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<std::string> done;
  int saw_four = 0;
  for (const auto& l : lines(out)) {
    const auto sp = l.find(' ');
    done.push_back(l.substr(0, sp));
    if (std::stoi(l.substr(sp + 1)) >= 4) ++saw_four;
  }
  std::sort(done.begin(), done.end());
  std::vector<std::string> want;
  for (int i = 0; i < kJobs; ++i) want.push_back(std::to_string(i % 6) + "/r" + std::to_string(i / 6));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(done, want) << "each job's CMD exactly once";
  const auto summary = json::parse(r.out);
  EXPECT_EQ(summary.at("completed"), kJobs);
  // One at a time, the first three CMDs would have given up waiting alone.
  EXPECT_EQ(saw_four, kJobs) << "the CMDs did not run four at once";
  EXPECT_EQ(jobs_json("ls", {"--stream", stream_}).at("pending"), 0);
}

TEST_F(JobsCli, WorkWithoutDashesBeforeCmdIsAUsageError) {
  const auto r = jobs("work", {"--stream", stream_, "--class", "t", "true"});
  EXPECT_EQ(r.status, 64) << r.err;
  EXPECT_NE(r.err.find("`--`"), std::string::npos) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
}

}  // namespace
}  // namespace jobguard::test
