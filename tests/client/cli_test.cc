// jobbroker-cli, run as a user would (its real binary, a real broker): every command's human
// output, its --json output parsed back into the API's messages, where payloads come from, and
// the exit codes scripts test.
#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "core/ids.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/fake_cluster.h"
#include "tests/testing/matchers.h"

extern char** environ;

#ifndef JOBBROKER_CLI_BINARY
#error "JOBBROKER_CLI_BINARY must name the jobbroker-cli binary under test"
#endif

namespace jobbroker::testing {
namespace {

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::ostream& operator<<(std::ostream& os, const CliResult& r) {
  return os << "exit " << r.exit_code << "\n--- stdout ---\n"
            << r.out << "--- stderr ---\n"
            << r.err;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Parses proto3 JSON into a message, failing the test if it does not parse.
template <typename Message>
Message FromJson(const std::string& json) {
  Message m;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &m);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return m;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<BrokerProcess>> broker = BrokerProcess::Start();
    ASSERT_TRUE(broker.ok()) << broker.status();
    broker_ = *std::move(broker);
    client_ = std::make_unique<BrokerClient>(broker_->NewChannel());
  }

  // Runs jobbroker-cli with `args` after "--address <the broker>", `stdin_text` on its stdin (a
  // file, so never a terminal) and without $JOBBROKER_ADDRESS unless `env` sets it.
  CliResult Cli(std::vector<std::string> args, const std::string& stdin_text = "",
                bool with_address = true, const std::vector<std::string>& env = {}) {
    if (with_address) args.insert(args.begin(), {"--address", broker_->address()});
    return RunCli(args, stdin_text, env);
  }

  CliResult RunCli(const std::vector<std::string>& args, const std::string& stdin_text,
                   const std::vector<std::string>& env) {
    const TempDir& dir = broker_->temp_dir();
    const int n = runs_++;
    const std::string in_path = *dir.WriteFile(absl::StrCat("cli-", n, ".in"), stdin_text);
    const std::string out_path = absl::StrCat(dir.path(), "/cli-", n, ".out");
    const std::string err_path = absl::StrCat(dir.path(), "/cli-", n, ".err");

    std::vector<std::string> argv_strings = {JOBBROKER_CLI_BINARY};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_strings) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      if (!absl::StartsWith(*e, "JOBBROKER_ADDRESS=")) env_strings.push_back(*e);
    }
    env_strings.insert(env_strings.end(), env.begin(), env.end());
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);

    // posix_spawn rather than fork: this process has gRPC's threads.
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, in_path.c_str(), O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = -1;
    const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    CliResult result;
    if (spawned != 0) {
      ADD_FAILURE() << "posix_spawn " << argv[0] << ": " << std::strerror(spawned);
      return result;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    result.out = ReadFile(out_path);
    result.err = ReadFile(err_path);
    return result;
  }

  // Enqueues through the CLI; returns the job id it printed.
  std::string CliEnqueue(const std::vector<std::string>& args) {
    std::vector<std::string> full = {"enqueue"};
    full.insert(full.end(), args.begin(), args.end());
    CliResult r = Cli(full);
    EXPECT_EQ(r.exit_code, 0) << r;
    std::string id = r.out;
    if (!id.empty() && id.back() == '\n') id.pop_back();
    return id;
  }

  std::unique_ptr<BrokerProcess> broker_;
  std::unique_ptr<BrokerClient> client_;
  int runs_ = 0;
};

TEST_F(CliTest, HealthPrintsServing) {
  CliResult r = Cli({"health"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "SERVING\n");
  EXPECT_EQ(r.err, "");
}

TEST_F(CliTest, EnqueuePassesEveryOption) {
  CliResult r = Cli({"enqueue",
                     "emails",
                     R"({"to":"ada"})",
                     "--header",
                     "trace=abc",
                     "--header",
                     "lang=en",
                     "--priority",
                     "5",
                     "--delay",
                     "10m",
                     "--dedup-key",
                     "welcome-ada",
                     "--dedup-ttl",
                     "2h",
                     "--max-attempts",
                     "3",
                     "--lease-duration",
                     "1.5s",
                     "--concurrency-key",
                     "tenant-a"});
  ASSERT_EQ(r.exit_code, 0) << r;
  ASSERT_THAT(Lines(r.out), SizeIs(1));
  const std::string id = Lines(r.out)[0];
  EXPECT_THAT(id, SizeIs(26));  // a ULID, nothing else on the line

  v1::Job job = client_->MustGetJob(id);
  EXPECT_EQ(job.queue(), "emails");
  EXPECT_EQ(job.payload(), R"({"to":"ada"})");
  EXPECT_THAT(job.headers(), UnorderedElementsAre(Pair("trace", "abc"), Pair("lang", "en")));
  EXPECT_EQ(job.priority(), 5);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(FromProto(job.run_at()) - FromProto(job.created_at()), absl::Minutes(10));
  EXPECT_EQ(job.dedup_key(), "welcome-ada");
  EXPECT_EQ(job.max_attempts(), 3);
  EXPECT_EQ(job.concurrency_key(), "tenant-a");

  // The same key again: the same job, said so in both output forms.
  r = Cli({"enqueue", "emails", R"({"to":"ada"})", "--dedup-key", "welcome-ada"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, id + " (deduplicated)\n");
  r = Cli({"enqueue", "emails", R"({"to":"ada"})", "--dedup-key", "welcome-ada", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r;
  v1::EnqueueResponse resp = FromJson<v1::EnqueueResponse>(r.out);
  EXPECT_EQ(resp.job_id(), id);
  EXPECT_TRUE(resp.deduplicated());
  EXPECT_THAT(r.out, HasSubstr(R"("deduplicated":true)"));
}

TEST_F(CliTest, EnqueueRunAtAndLeaseDuration) {
  const std::string later = CliEnqueue({"q", "x", "--run-at", "2100-01-01T00:00:00Z"});
  EXPECT_EQ(FromProto(client_->MustGetJob(later).run_at()), absl::FromUnixSeconds(4102444800));

  const std::string now = CliEnqueue({"q", "y", "--lease-duration", "1m30s"});
  std::optional<v1::LeasedJob> leased = client_->LeaseOne("q", "worker-1");
  ASSERT_TRUE(leased.has_value());
  EXPECT_EQ(leased->job_id(), now);
  v1::Job job = client_->MustGetJob(now);
  ASSERT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(FromProto(job.lease_deadline()) - FromProto(job.attempts(0).started_at()),
            absl::Seconds(90));
}

TEST_F(CliTest, EnqueueTimeoutAndExpiryAndGetShowsThem) {
  const std::string id = CliEnqueue(
      {"limits", "x", "--timeout", "2m", "--expire-at", "2100-01-01T00:00:00Z", "--delay", "1h"});
  v1::Job job = client_->MustGetJob(id);
  EXPECT_EQ(job.timeout().seconds(), 120);
  EXPECT_EQ(FromProto(job.expire_at()), absl::FromUnixSeconds(4102444800));
  CliResult r = Cli({"get", id});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("timeout:"), HasSubstr("2m"), HasSubstr("expires:")));

  const absl::Time before = absl::Now();
  const std::string soon = CliEnqueue({"limits", "y", "--expire-in", "1h"});
  const absl::Time expire_at = FromProto(client_->MustGetJob(soon).expire_at());
  EXPECT_GE(expire_at, before + absl::Hours(1));
  EXPECT_LE(expire_at, absl::Now() + absl::Hours(1));

  r = Cli({"enqueue", "limits", "z", "--expire-at", "2100-01-01T00:00:00Z", "--expire-in", "1h"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("--expire-at or --expire-in"));
  r = Cli({"enqueue", "limits", "z", "--timeout", "10ms"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("timeout"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("DEADLINE_EXCEEDED")))
      << "the job's limit is not the call's deadline";

  // The global --timeout, before the command's name, is the deadline of the call only.
  r = Cli({"--timeout", "5s", "enqueue", "limits", "w"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::string plain = r.out;
  if (!plain.empty() && plain.back() == '\n') plain.pop_back();
  EXPECT_FALSE(client_->MustGetJob(plain).has_timeout()) << "not the job's run-time limit";
  // A broker that answers nothing (SIGSTOP): a 1 ns deadline could still be met by a fast
  // loopback answer (gRPC keeps deadlines to the millisecond), and was, once, in CI's load.
  ASSERT_EQ(kill(broker_->pid(), SIGSTOP), 0);
  r = Cli({"--timeout", "100ms", "enqueue", "limits", "w"});
  ASSERT_EQ(kill(broker_->pid(), SIGCONT), 0);
  EXPECT_EQ(r.exit_code, 3) << r;
  EXPECT_THAT(r.err, HasSubstr("DEADLINE_EXCEEDED"));
}

TEST_F(CliTest, WatchFollowsAJobToItsEndAndExitsByHowItEnded) {
  const std::string done = CliEnqueue({"watched", "x"});
  std::optional<v1::LeasedJob> leased = client_->LeaseOne("watched", "worker-1");
  ASSERT_TRUE(leased.has_value());
  client_->MustAck(*leased, "fine");
  CliResult r = Cli({"watch", done});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("COMPLETED"), HasSubstr("fine")));

  const std::string dead = CliEnqueue({"watched", "y", "--max-attempts", "1"});
  leased = client_->LeaseOne("watched", "worker-1");
  ASSERT_TRUE(leased.has_value());
  v1::FailRequest fail;
  fail.set_job_id(dead);
  fail.set_lease_id(leased->lease_id());
  fail.set_error("no");
  v1::FailResponse fail_reply;
  ASSERT_TRUE(client_->Fail(fail, &fail_reply).ok());
  r = Cli({"watch", dead});
  EXPECT_EQ(r.exit_code, 4) << r;
  EXPECT_THAT(r.out, HasSubstr("FAILED"));

  const std::string cancelled = CliEnqueue({"watched", "z"});
  v1::Job job;
  ASSERT_TRUE(client_->CancelJob(cancelled, &job).ok());
  r = Cli({"watch", cancelled, "--json"});
  EXPECT_EQ(r.exit_code, 5) << r;
  EXPECT_THAT(r.out, HasSubstr("JOB_STATE_CANCELLED"));

  r = Cli({"watch", "01ARZ3NDEKTSV4RRFFQ69G5FAV"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
}

TEST_F(CliTest, EnqueueWaitPrintsTheIdThenTheFinishedJob) {
  // A worker in the test: takes the job when it comes and acks it with a result.
  std::thread worker([this] {
    std::optional<v1::LeasedJob> leased = client_->LeaseOne("waits", "worker-1", absl::Seconds(30));
    if (leased.has_value()) client_->MustAck(*leased, "the answer");
  });
  CliResult r = Cli({"enqueue", "waits", "question", "--wait", "--wait-timeout", "60s"});
  worker.join();
  EXPECT_EQ(r.exit_code, 0) << r;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_FALSE(lines.empty());
  EXPECT_THAT(lines[0], SizeIs(26)) << "the job id comes first";
  EXPECT_THAT(r.out, AllOf(HasSubstr("COMPLETED"), HasSubstr("the answer")));

  // Nobody works the queue: the wait gives up, the job stays.
  r = Cli({"enqueue", "idle", "x", "--wait", "--wait-timeout", "0.3s"});
  EXPECT_EQ(r.exit_code, 3) << r;
  EXPECT_THAT(r.err, HasSubstr("DEADLINE_EXCEEDED"));
  EXPECT_EQ(client_->Counts("idle")["JOB_STATE_READY"], 1);

  r = Cli({"enqueue", "idle", "x", "--wait-timeout", "1s"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("--wait-timeout needs --wait"));
}

TEST_F(CliTest, PayloadFromArgumentFileAndStdin) {
  const std::string binary("bin\0\x01\xff", 6);
  const std::string path = *broker_->temp_dir().WriteFile("payload.bin", binary);
  EXPECT_EQ(client_->MustGetJob(CliEnqueue({"q", "--file", path})).payload(), binary);

  CliResult r = Cli({"enqueue", "q", "-"}, "from stdin\n");
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(client_->MustGetJob(Lines(r.out)[0]).payload(), "from stdin\n");

  // No PAYLOAD and stdin is not a terminal: stdin too (`echo ... | jobbroker-cli enqueue q`).
  r = Cli({"enqueue", "q"}, R"({"piped":true})");
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(client_->MustGetJob(Lines(r.out)[0]).payload(), R"({"piped":true})");

  // The argument wins over stdin.
  r = Cli({"enqueue", "q", "argument"}, "ignored");
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(client_->MustGetJob(Lines(r.out)[0]).payload(), "argument");

  r = Cli({"enqueue", "q", "argument", "--file", path});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("not both"));
  r = Cli({"enqueue", "q", "--file", "/no/such/file"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("/no/such/file"));
}

TEST_F(CliTest, GetShowsAttemptsErrorsAndFailReason) {
  const std::string id = CliEnqueue({"mail", "hello", "--max-attempts", "1", "--header", "k=v"});
  std::optional<v1::LeasedJob> leased = client_->LeaseOne("mail", "worker-7");
  ASSERT_TRUE(leased.has_value());
  v1::FailRequest fail;
  fail.set_job_id(id);
  fail.set_lease_id(leased->lease_id());
  fail.set_error("smtp: connection refused");
  v1::FailResponse failed;
  ASSERT_THAT(client_->Fail(fail, &failed), IsOk());

  CliResult r = Cli({"get", id});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("id:"));
  EXPECT_THAT(r.out, HasSubstr(id));
  EXPECT_THAT(r.out, HasSubstr("queue:"));
  EXPECT_THAT(r.out, HasSubstr("FAILED (ATTEMPTS_EXHAUSTED)"));
  EXPECT_THAT(r.out, HasSubstr("1 of 1"));
  EXPECT_THAT(r.out, HasSubstr("k=v"));
  EXPECT_THAT(r.out, HasSubstr("payload:"));
  EXPECT_THAT(r.out, HasSubstr("hello"));
  EXPECT_THAT(r.out, HasSubstr("last error:"));
  EXPECT_THAT(r.out, HasSubstr("created:"));
  EXPECT_THAT(r.out, HasSubstr("ended:"));
  // The attempts table: a header, then attempt 1 by worker-7 that ended in ERROR.
  const std::vector<std::string> lines = Lines(r.out);
  auto header = std::find_if(lines.begin(), lines.end(),
                             [](const std::string& l) { return absl::StartsWith(l, "#"); });
  ASSERT_NE(header, lines.end()) << r;
  EXPECT_THAT(*header, AllOf(HasSubstr("WORKER"), HasSubstr("STARTED"), HasSubstr("ENDED"),
                             HasSubstr("OUTCOME"), HasSubstr("ERROR")));
  ASSERT_NE(header + 1, lines.end());
  EXPECT_THAT(*(header + 1), AllOf(StartsWith("1"), HasSubstr("worker-7"), HasSubstr("ERROR"),
                                   HasSubstr("smtp: connection refused")));

  r = Cli({"get", id, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  v1::Job from_cli = FromJson<v1::Job>(r.out);
  v1::Job from_api = client_->MustGetJob(id);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(from_cli, from_api))
      << from_cli.DebugString() << "\nvs\n"
      << from_api.DebugString();
  EXPECT_EQ(from_cli.fail_reason(), v1::FAIL_REASON_ATTEMPTS_EXHAUSTED);
}

TEST_F(CliTest, ListShowsATableAndFollowsFlags) {
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(CliEnqueue({"list-q", absl::StrCat("job-", i)}));
  const std::string delayed = CliEnqueue({"list-q", "later", "--delay", "1h", "--priority", "3"});

  CliResult r = Cli({"list", "list-q"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_THAT(lines, SizeIs(6)) << r;
  EXPECT_THAT(lines[0], AllOf(StartsWith("ID"), HasSubstr("STATE"), HasSubstr("ATTEMPT"),
                              HasSubstr("PRIORITY"), HasSubstr("AGE"), HasSubstr("LAST ERROR")));
  EXPECT_THAT(lines[1], AllOf(StartsWith(ids[0]), HasSubstr("READY"), HasSubstr("0/5")));
  EXPECT_THAT(lines[5], AllOf(StartsWith(delayed), HasSubstr("SCHEDULED")));
  // Aligned: every row's STATE starts where the header's does.
  const size_t state_column = lines[0].find("STATE");
  for (size_t i = 1; i < lines.size(); ++i)
    EXPECT_EQ(lines[i].find_first_of("RS", 26), state_column);

  r = Cli({"list", "list-q", "--state", "scheduled"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(Lines(r.out), SizeIs(2));
  EXPECT_THAT(r.out, HasSubstr(delayed));

  r = Cli({"list", "list-q", "--limit", "2"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(Lines(r.out), SizeIs(3));
  EXPECT_THAT(r.err, HasSubstr("--limit 2"));

  r = Cli({"list", "list-q", "--newest-first", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  v1::ListJobsResponse listed =
      FromJson<v1::ListJobsResponse>(absl::StrCat(R"({"jobs":)", r.out, "}"));
  std::vector<std::string> listed_ids;
  for (const v1::Job& job : listed.jobs()) listed_ids.push_back(job.id());
  EXPECT_THAT(listed_ids, ElementsAre(delayed, ids[3], ids[2], ids[1], ids[0]));

  r = Cli({"list", "list-q", "--state", "done"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("ready|scheduled|active|completed|failed|cancelled"));
}

TEST_F(CliTest, ListFollowsPageTokensUpToTheLimit) {
  // More jobs than the broker's largest page (1000), so the CLI must ask for a second page.
  for (int batch = 0; batch < 2; ++batch) {
    v1::EnqueueBatchRequest req;
    for (int i = 0; i < 600; ++i) {
      v1::EnqueueRequest* job = req.add_jobs();
      job->set_queue("big");
      job->set_payload(absl::StrCat(batch, "-", i));
    }
    v1::EnqueueBatchResponse resp;
    ASSERT_THAT(client_->EnqueueBatch(req, &resp), IsOk());
  }
  CliResult r = Cli({"list", "big", "--limit", "1100", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  v1::ListJobsResponse listed =
      FromJson<v1::ListJobsResponse>(absl::StrCat(R"({"jobs":)", r.out, "}"));
  EXPECT_EQ(listed.jobs_size(), 1100);

  r = Cli({"list", "big", "--limit", "5000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(Lines(r.out), SizeIs(1201));  // header + every job
  EXPECT_EQ(r.err, "");
}

TEST_F(CliTest, WorkersShowsWhoRunsWhat) {
  const std::string id = CliEnqueue({"renders", "frame-1"});
  ASSERT_THAT(client_->MustLease("renders", "gpu-7"), SizeIs(1));

  CliResult r = Cli({"workers"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_THAT(lines, SizeIs(2)) << r;
  EXPECT_THAT(lines[0], AllOf(StartsWith("WORKER"), HasSubstr("QUEUES"), HasSubstr("RUNNING"),
                              HasSubstr("JOBS")));
  std::vector<std::string> row = absl::StrSplit(lines[1], ' ', absl::SkipEmpty());
  ASSERT_THAT(row, SizeIs(6)) << lines[1];
  EXPECT_EQ(row[0], "gpu-7");
  EXPECT_EQ(row[1], "renders");  // the queue of its latest Lease call
  EXPECT_EQ(row[2], "0");        // connections: it leases by unary calls
  EXPECT_EQ(row[3], "1");        // running
  EXPECT_EQ(row[4], "-");        // not connected now
  EXPECT_EQ(row[5], id);

  r = Cli({"workers", "other"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(Lines(r.out), SizeIs(1)) << "only the header: nobody takes or runs jobs of other";

  r = Cli({"--json", "workers", "renders"});
  ASSERT_EQ(r.exit_code, 0) << r;
  v1::ListWorkersResponse workers =
      FromJson<v1::ListWorkersResponse>(absl::StrCat(R"({"workers":)", r.out, "}"));
  ASSERT_EQ(workers.workers_size(), 1);
  EXPECT_EQ(workers.workers(0).worker_id(), "gpu-7");
  ASSERT_EQ(workers.workers(0).running_size(), 1);
  EXPECT_EQ(workers.workers(0).running(0).job_id(), id);
}

TEST_F(CliTest, SchedulesArePutListedRunPausedAndDeleted) {
  CliResult r = Cli({"schedule", "put", "digest",
                     R"({"every":"3600s","template":{"queue":"mail","payload":"ZGlnZXN0"}})"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, AllOf(StartsWith("digest active, next run "), HasSubstr("(in 59m")));

  r = Cli({"schedules"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_THAT(lines, SizeIs(2)) << r;
  EXPECT_THAT(lines[0], AllOf(StartsWith("SCHEDULE"), HasSubstr("WHEN"), HasSubstr("NEXT RUN")));
  EXPECT_THAT(lines[1], AllOf(StartsWith("digest"), HasSubstr("every 1h"), HasSubstr("mail"),
                              HasSubstr("active")));

  r = Cli({"schedule", "run", "digest"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const std::string job_id(absl::StripAsciiWhitespace(r.out));
  EXPECT_EQ(client_->MustGetJob(job_id).payload(), "digest");

  r = Cli({"schedule", "pause", "digest"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("digest paused"));
  r = Cli({"--json", "schedule", "get", "digest"});
  ASSERT_EQ(r.exit_code, 0) << r;
  v1::Schedule s = FromJson<v1::Schedule>(r.out);
  EXPECT_TRUE(s.paused());
  EXPECT_EQ(s.last_job_id(), job_id);
  r = Cli({"schedule", "resume", "digest"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, StartsWith("digest active"));

  r = Cli({"schedule", "put", "digest", R"({"every":"1s"})"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT: schedule.template.queue"));
  r = Cli({"schedule", "put", "digest", R"({"evry":"1s"})"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("JSON is not a Schedule"));

  r = Cli({"schedule", "delete", "digest"});
  ASSERT_EQ(r.exit_code, 0) << r;
  r = Cli({"schedule", "get", "digest"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
}

TEST_F(CliTest, EnqueueAfterMakesAJobWaitAndGetShowsWhatFor) {
  const std::string first = CliEnqueue({"resize", "a"});
  const std::string second = CliEnqueue({"resize", "b"});
  const std::string join = CliEnqueue({"resize", "join", "--after", first, "--after", second});
  CliResult r = Cli({"get", join});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("state:"));
  EXPECT_THAT(r.out, HasSubstr("WAITING"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex(absl::StrCat("waits for: +", first)));
  r = Cli({"get", first});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, ::testing::ContainsRegex(absl::StrCat("needed by: +", join)));
  std::vector<v1::LeasedJob> leased = client_->MustLease("resize", "w", 2);
  ASSERT_THAT(leased, SizeIs(2));
  for (const v1::LeasedJob& j : leased) client_->MustAck(j, absl::StrCat("done-", j.payload()));
  r = Cli({"get", join});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("READY"));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat(first, " (result done-a)")));
}

TEST_F(CliTest, QueuesShowsCountsByState) {
  CliEnqueue({"alpha", "a"});
  CliEnqueue({"alpha", "b"});
  const std::string c = CliEnqueue({"alpha", "c", "--delay", "1h"});
  CliEnqueue({"alpha", "after c", "--after", c});
  CliEnqueue({"beta", "d"});

  CliResult r = Cli({"queues"});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_THAT(lines, SizeIs(3)) << r;
  EXPECT_THAT(lines[0], AllOf(StartsWith("QUEUE"), HasSubstr("WAITING"), HasSubstr("READY"),
                              HasSubstr("SCHEDULED"), HasSubstr("ACTIVE"), HasSubstr("COMPLETED"),
                              HasSubstr("FAILED"), HasSubstr("CANCELLED"),
                              HasSubstr("OLDEST READY"), HasSubstr("WAITING WORKERS")));
  std::vector<std::string> alpha = absl::StrSplit(lines[1], ' ', absl::SkipEmpty());
  ASSERT_THAT(alpha, SizeIs(10)) << lines[1];
  EXPECT_EQ(alpha[0], "alpha");
  EXPECT_EQ(alpha[1], "1");  // waiting for a dependency
  EXPECT_EQ(alpha[2], "2");  // ready
  EXPECT_EQ(alpha[3], "1");  // scheduled
  EXPECT_EQ(alpha[9], "0");  // waiting workers
  EXPECT_THAT(lines[2], StartsWith("beta"));

  r = Cli({"--json", "queues"});
  ASSERT_EQ(r.exit_code, 0) << r;
  v1::ListQueuesResponse queues =
      FromJson<v1::ListQueuesResponse>(absl::StrCat(R"({"queues":)", r.out, "}"));
  ASSERT_EQ(queues.queues_size(), 2);
  EXPECT_EQ(queues.queues(0).name(), "alpha");
  EXPECT_EQ(queues.queues(0).counts().at("JOB_STATE_READY"), 2);
  EXPECT_EQ(queues.queues(0).counts().at("JOB_STATE_SCHEDULED"), 1);
  EXPECT_TRUE(queues.queues(0).policy().has_retry());
}

TEST_F(CliTest, PolicyGetAndSet) {
  CliEnqueue({"pol", "x"});
  CliResult r = Cli({"policy", "get", "pol"});
  ASSERT_EQ(r.exit_code, 0) << r;
  v1::QueuePolicy policy = FromJson<v1::QueuePolicy>(r.out);
  EXPECT_EQ(policy.retry().max_attempts(), 5);
  EXPECT_EQ(policy.max_concurrency(), 0);

  r = Cli({"policy", "set", "pol", R"({"maxConcurrency":5})"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(FromJson<v1::QueuePolicy>(r.out).max_concurrency(), 5);
  v1::QueueInfo info;
  ASSERT_THAT(client_->GetQueue("pol", &info), IsOk());
  EXPECT_EQ(info.policy().max_concurrency(), 5);

  // --reset drops the earlier change; the new one applies on top.
  r = Cli({"policy", "set", "pol", R"({"retry":{"maxAttempts":2}})", "--reset"});
  ASSERT_EQ(r.exit_code, 0) << r;
  policy = FromJson<v1::QueuePolicy>(r.out);
  EXPECT_EQ(policy.max_concurrency(), 0);
  EXPECT_EQ(policy.retry().max_attempts(), 2);

  r = Cli({"policy", "set", "pol", "-"}, R"({"paused":true})");
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(FromJson<v1::QueuePolicy>(r.out).paused());

  r = Cli({"policy", "set", "pol", R"({"maxConcurency":5})"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("maxConcurency"));
  r = Cli({"policy", "set", "pol", R"({"maxConcurrency":-1})"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("error: INVALID_ARGUMENT: "));
  r = Cli({"policy", "get", "unknown-queue"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("error: NOT_FOUND: "));
  r = Cli({"policy", "delete", "pol"});
  EXPECT_EQ(r.exit_code, 2) << r;
}

TEST_F(CliTest, CancelEndsAJobAndRefusesTwice) {
  const std::string id = CliEnqueue({"c", "x"});
  CliResult r = Cli({"cancel", id});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, id + " CANCELLED\n");
  EXPECT_EQ(client_->MustGetJob(id).state(), v1::JOB_STATE_CANCELLED);

  r = Cli({"cancel", id});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("error: FAILED_PRECONDITION: "));

  // An active job: cancel is requested, and its worker is told.
  const std::string active = CliEnqueue({"c", "y"});
  ASSERT_TRUE(client_->LeaseOne("c", "worker-1").has_value());
  r = Cli({"cancel", active, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  v1::Job job = FromJson<v1::Job>(r.out);
  EXPECT_EQ(job.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_TRUE(job.cancel_requested());
}

// Jobs of `queue` that failed for good (one attempt each), oldest first.
std::vector<std::string> FailJobs(BrokerClient& client, const std::string& queue, int n) {
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) {
    v1::EnqueueRequest req;
    req.set_queue(queue);
    req.set_payload(absl::StrCat("job-", i));
    req.set_max_attempts(1);
    client.MustEnqueue(req);
    std::optional<v1::LeasedJob> leased = client.LeaseOne(queue, "worker-1");
    EXPECT_TRUE(leased.has_value());
    if (!leased.has_value()) break;
    v1::FailRequest fail;
    fail.set_job_id(leased->job_id());
    fail.set_lease_id(leased->lease_id());
    fail.set_error("boom");
    v1::FailResponse failed;
    EXPECT_THAT(client.Fail(fail, &failed), IsOk());
    ids.push_back(leased->job_id());
  }
  return ids;
}

TEST_F(CliTest, RetryPutsAJobBackAndRefusesTwice) {
  const std::string id = FailJobs(*client_, "r", 1)[0];
  CliResult r = Cli({"retry", id});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, id + " READY\n");
  EXPECT_EQ(client_->MustGetJob(id).state(), v1::JOB_STATE_READY);

  r = Cli({"retry", id});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, AllOf(StartsWith("error: FAILED_PRECONDITION: "), HasSubstr("READY")));

  const std::string cancelled = CliEnqueue({"r", "x"});
  ASSERT_EQ(Cli({"cancel", cancelled}).exit_code, 0);
  r = Cli({"retry", cancelled, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  v1::RetryJobResponse resp = FromJson<v1::RetryJobResponse>(r.out);
  EXPECT_EQ(resp.job().id(), cancelled);
  EXPECT_EQ(resp.job().state(), v1::JOB_STATE_READY);
  EXPECT_EQ(resp.retried(), 1);

  r = Cli({"retry", "01NOSUCHJOB"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("error: NOT_FOUND: "));
}

TEST_F(CliTest, RetryQueueRedrivesDryRunLimitAndCancelled) {
  FailJobs(*client_, "dead", 3);
  const std::string cancelled = CliEnqueue({"dead", "x"});
  ASSERT_EQ(Cli({"cancel", cancelled}).exit_code, 0);

  CliResult r = Cli({"retry", "--queue", "dead", "--dry-run"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "would retry 3 failed jobs of dead (dry run: nothing changed)\n");
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(client_->Counts("dead").at("JOB_STATE_FAILED"), 3);

  r = Cli({"retry", "--queue", "dead", "--limit", "2"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "retried 2 failed jobs of dead\n");
  EXPECT_THAT(r.err, HasSubstr("limit of 2"));  // there may be more
  EXPECT_EQ(client_->Counts("dead").at("JOB_STATE_FAILED"), 1);

  r = Cli({"retry", "--queue", "dead", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  v1::RetryJobResponse resp = FromJson<v1::RetryJobResponse>(r.out);
  EXPECT_EQ(resp.matched(), 1);
  EXPECT_EQ(resp.retried(), 1);
  EXPECT_FALSE(resp.has_job());

  r = Cli({"retry", "--queue", "dead", "--state", "cancelled"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "retried 1 cancelled job of dead\n");
  EXPECT_EQ(client_->Counts("dead"), (std::map<std::string, int64_t>{{"JOB_STATE_READY", 4}}));

  r = Cli({"retry", "--queue", "never-used"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("error: NOT_FOUND: "));
  r = Cli({"retry", "--queue", "dead", "--limit", "100001"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, AllOf(StartsWith("error: INVALID_ARGUMENT: "), HasSubstr("limit")));
}

TEST_F(CliTest, DeleteRemovesAJobButNotAnActiveOne) {
  const std::string id = CliEnqueue({"d", "x"});
  CliResult r = Cli({"delete", id});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, id + " deleted\n");
  r = Cli({"delete", id});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("error: NOT_FOUND: "));

  const std::string active = CliEnqueue({"d", "y"});
  ASSERT_TRUE(client_->LeaseOne("d", "worker-1").has_value());
  r = Cli({"delete", active});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, AllOf(StartsWith("error: FAILED_PRECONDITION: "), HasSubstr("cancel")));

  const std::string other = CliEnqueue({"d", "z"});
  r = Cli({"delete", other, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "{}\n");
}

TEST_F(CliTest, PauseAndResume) {
  CliEnqueue({"p", "x"});
  CliResult r = Cli({"pause", "p"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "p paused\n");
  EXPECT_THAT(client_->MustLease("p", "worker-1"), IsEmpty());

  r = Cli({"pause", "p", "--json"});  // again: still paused, no error
  ASSERT_EQ(r.exit_code, 0) << r;
  v1::QueueInfo info = FromJson<v1::QueueInfo>(r.out);
  EXPECT_EQ(info.name(), "p");
  EXPECT_TRUE(info.policy().paused());
  EXPECT_EQ(info.counts().at("JOB_STATE_READY"), 1);

  r = Cli({"resume", "p"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "p resumed\n");
  EXPECT_THAT(client_->MustLease("p", "worker-1"), SizeIs(1));
  r = Cli({"pause", "p"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "p paused (1 active jobs run on)\n");

  for (const char* command : {"pause", "resume"}) {
    r = Cli({command, "never-used"});
    EXPECT_EQ(r.exit_code, 1) << r;
    EXPECT_THAT(r.err, StartsWith("error: NOT_FOUND: ")) << command;
  }
}

TEST_F(CliTest, PurgeRemovesEndedJobsOrTheStatesNamed) {
  FailJobs(*client_, "old", 2);
  const std::string cancelled = CliEnqueue({"old", "c"});
  ASSERT_EQ(Cli({"cancel", cancelled}).exit_code, 0);
  CliEnqueue({"old", "ready"});
  CliEnqueue({"old", "later", "--delay", "1h"});

  CliResult r = Cli({"purge", "old"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "purged 3 jobs (COMPLETED, FAILED, CANCELLED) from old\n");
  EXPECT_EQ(client_->Counts("old"),
            (std::map<std::string, int64_t>{{"JOB_STATE_READY", 1}, {"JOB_STATE_SCHEDULED", 1}}));

  r = Cli({"purge", "old", "--state", "ready", "--state", "scheduled", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(FromJson<v1::PurgeQueueResponse>(r.out).purged(), 2);
  EXPECT_THAT(client_->Counts("old"), IsEmpty());

  r = Cli({"purge", "old", "--state", "active"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, AllOf(StartsWith("error: INVALID_ARGUMENT: "), HasSubstr("states")));
  r = Cli({"purge", "never-used"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("error: NOT_FOUND: "));
}

TEST_F(CliTest, BrokerRefusalsExitOneWithCodeAndMessage) {
  CliResult r = Cli({"get", "no-such-job"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("error: NOT_FOUND: "));
  EXPECT_THAT(r.err, HasSubstr("no-such-job"));
  EXPECT_EQ(r.out, "");

  r = Cli({"enqueue", "bad queue!", "x"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, StartsWith("error: INVALID_ARGUMENT: "));
  EXPECT_THAT(r.err, HasSubstr("queue"));

  r = Cli({"enqueue", "q", "x", "--max-attempts", "-1"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, AllOf(StartsWith("error: INVALID_ARGUMENT: "), HasSubstr("max_attempts")));
}

TEST_F(CliTest, BadCommandLinesExitTwoAndSendNothing) {
  const std::vector<std::vector<std::string>> bad = {
      {"frobnicate"},
      {"enqueue"},
      {"enqueue", "q", "x", "extra"},
      {"enqueue", "q", "x", "--nope"},
      {"enqueue", "q", "x", "--delay", "10x"},
      {"enqueue", "q", "x", "--delay", "1s", "--run-at", "2100-01-01T00:00:00Z"},
      {"enqueue", "q", "x", "--run-at", "tomorrow"},
      {"enqueue", "q", "x", "--priority", "high"},
      {"enqueue", "q", "x", "--header", "no-equals-sign"},
      {"enqueue", "q", "x", "--priority"},
      {"get"},
      {"list", "q", "--limit", "0"},
      {"policy"},
      {"health", "--timeout", "soon"},
      {"--json=1", "health"},
      {"retry"},
      {"retry", "some-id", "--queue", "q"},
      {"retry", "some-id", "--dry-run"},
      {"retry", "--queue", "q", "--state", "ready"},
      {"retry", "--queue", "q", "--state", "nope"},
      {"retry", "--queue", "q", "--limit", "0"},
      {"retry", "--queue"},
      {"delete"},
      {"delete", "a", "b"},
      {"pause"},
      {"resume", "q", "extra"},
      {"purge"},
      {"purge", "q", "--state", "finished"},
  };
  for (const std::vector<std::string>& args : bad) {
    CliResult r = Cli(args);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(args, " ") << "\n" << r;
    EXPECT_THAT(r.err, StartsWith("error: ")) << absl::StrJoin(args, " ");
    EXPECT_EQ(r.out, "") << absl::StrJoin(args, " ");
  }
  EXPECT_THAT(client_->Counts("q"), IsEmpty());

  // No arguments at all: the usage text, on stderr.
  CliResult r = RunCli({}, "", {});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("Commands:"));
}

TEST_F(CliTest, UnreachableBrokerExitsThree) {
  // A port that refuses connections: bound by us, not listening.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string closed = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));

  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"health"},
                                             {"enqueue", "q", "x"},
                                             {"get", "some-id"},
                                             {"queues"},
                                             {"delete", "some-id"},
                                             {"pause", "q"}}) {
    std::vector<std::string> full = {"--address", closed, "--timeout", "2s"};
    full.insert(full.end(), args.begin(), args.end());
    CliResult r = RunCli(full, "", {});
    EXPECT_EQ(r.exit_code, 3) << absl::StrJoin(args, " ") << "\n" << r;
    EXPECT_THAT(r.err, StartsWith("error: UNAVAILABLE: ")) << absl::StrJoin(args, " ");
  }
  close(fd);
}

TEST_F(CliTest, AddressComesFromTheEnvironment) {
  CliResult r = Cli({"health"}, "", /*with_address=*/false,
                    {absl::StrCat("JOBBROKER_ADDRESS=", broker_->address())});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "SERVING\n");
}

TEST_F(CliTest, AnAddressListReachesTheLeaderAndClusterShowsTheLayout) {
  // Fake nodes in this process (tests/testing/fake_cluster.h): partition p led by node p % 3.
  FakeCluster cluster(3, 4);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);  // bound, not listening: a node that is down
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string list = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port), ",",
                                        cluster.node(1).address(), ",", cluster.node(2).address());

  CliResult r = RunCli({"--address", list, "cluster"}, "", {});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("cluster fake: 4 partitions"));
  for (int n = 0; n < 3; ++n) EXPECT_THAT(r.out, HasSubstr(cluster.node(n).address()));
  r = RunCli({"--address", list, "--json", "cluster"}, "", {});
  EXPECT_EQ(r.exit_code, 0) << r;
  const v1::ClusterInfo info = FromJson<v1::ClusterInfo>(r.out);
  EXPECT_EQ(info.nodes_size(), 3);
  EXPECT_EQ(info.partitions_size(), 4);

  // A queue of partition 0, led by node 0, which is not in the list.
  std::string queue = "q0";
  for (int i = 1; core::PartitionOfQueue(queue, 4) != 0; ++i) queue = absl::StrCat("q", i);
  r = RunCli({"--address", list, "enqueue", queue, "x"}, "", {});
  EXPECT_EQ(r.exit_code, 0) << r;
  r = RunCli({"enqueue", queue, "y"}, "", {absl::StrCat("JOBBROKER_ADDRESS=", list)});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(cluster.node(0).Count("Enqueue"), 2);
  EXPECT_EQ(cluster.node(1).Count("Enqueue") + cluster.node(2).Count("Enqueue"), 0);

  r = RunCli({"--address", " , ", "health"}, "", {});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("--address must name at least one HOST:PORT"));
  close(fd);
}

TEST_F(CliTest, HelpListsCommandsFlagsAndExitCodes) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"help"}, {"--help"}, {"-h"}}) {
    CliResult r = RunCli(args, "", {});
    EXPECT_EQ(r.exit_code, 0) << r;
    for (const char* word :
         {"enqueue QUEUE [PAYLOAD]", "get JOB", "list QUEUE", "cancel JOB",
          "retry JOB | --queue QUEUE", "delete JOB", "queues", "pause QUEUE", "resume QUEUE",
          "purge QUEUE", "policy get QUEUE", "policy set QUEUE JSON", "health", "cluster",
          "--address HOST:PORT[,...]", "--json", "--timeout", "Exit codes", "1.5s"}) {
      EXPECT_THAT(r.out, HasSubstr(word)) << absl::StrJoin(args, " ");
    }
  }
  CliResult r = RunCli({"enqueue", "--help"}, "", {});
  EXPECT_EQ(r.exit_code, 0) << r;
  for (const char* flag : {"--file", "--header", "--priority", "--delay", "--run-at", "--dedup-key",
                           "--dedup-ttl", "--max-attempts", "--lease-duration", "--concurrency-key",
                           "--timeout", "--expire-at", "--expire-in"}) {
    EXPECT_THAT(r.out, HasSubstr(flag));
  }
  r = RunCli({"help", "list"}, "", {});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out,
              AllOf(HasSubstr("--state"), HasSubstr("--limit"), HasSubstr("--newest-first")));
  EXPECT_THAT(r.out, Not(HasSubstr("--dedup-key")));
  r = RunCli({"help", "retry"}, "", {});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("--queue"), HasSubstr("--state"), HasSubstr("--dry-run"),
                           HasSubstr("--limit")));
  r = RunCli({"purge", "--help"}, "", {});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("--state"), HasSubstr("repeatable")));
}

}  // namespace
}  // namespace jobbroker::testing
