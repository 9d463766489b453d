// Storage faults with the real binary: the data dir on a small tmpfs that fills up (writes are
// refused with RESOURCE_EXHAUSTED, reads answer, readiness and metrics say so, writes come back
// once space is freed, without a restart, and nothing acknowledged is lost), and a job record
// corrupted on disk while the broker is down (it starts anyway, logs the key, counts it, and
// answers GetJob of that job with DATA_LOSS).
//
// The tmpfs mount needs root (CAP_SYS_ADMIN); the test fails, with the reason, if it cannot
// mount: a skipped fault test would hide exactly the regression it is for.

#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "storage/record_codec.h"
#include "storage/rocksdb_store.h"
#include "tests/testing/broker_client.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/broker_process.h"
#include "tests/testing/http_client.h"
#include "tests/testing/matchers.h"

namespace jobbroker::testing {
namespace {

constexpr char kQueue[] = "big";
// A full disk shows within a few dozen of these; under the 1 MiB default payload limit.
constexpr size_t kPayloadBytes = 512 << 10;
// How long the broker may take to notice freed space (it retries every second).
constexpr absl::Duration kResumeDeadline = absl::Seconds(30);

std::string Payload(int i) {
  std::string p = absl::StrCat("job-", i, "-");
  p.resize(kPayloadBytes, static_cast<char>('a' + i % 26));
  return p;
}

int ReadyzStatus(const BrokerProcess& broker) {
  auto r = HttpGetResponse(broker.http_address(), "/readyz");
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->status : 0;
}

int Health(const BrokerProcess& broker, const std::string& service) {
  int serving = -1;
  grpc::Status s = CheckHealth(broker.NewChannel(), service, &serving);
  EXPECT_TRUE(s.ok()) << service << ": " << s.error_message();
  return serving;
}

// A tmpfs of `megabytes` at `dir`, unmounted when this goes away.
class TmpfsMount {
 public:
  TmpfsMount(std::string dir, int megabytes) : dir_(std::move(dir)) {
    std::filesystem::create_directories(dir_);
    const std::string options = absl::StrCat("size=", megabytes, "m");
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) != 0) {
      error_ =
          absl::StrCat("mount -t tmpfs -o ", options, " tmpfs ", dir_, ": ", std::strerror(errno),
                       " (this test needs root, or CAP_SYS_ADMIN, to mount a small tmpfs)");
    }
  }
  ~TmpfsMount() {
    if (error_.empty() && ::umount2(dir_.c_str(), 0) != 0) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  const std::string& error() const { return error_; }

 private:
  const std::string dir_;
  std::string error_;
};

// The first test puts the data dir on its own mount before the start.
class StorageFaultTest : public BrokerFixture {
 protected:
  StorageFaultTest() : BrokerFixture(kStartInTest) {}
};

TEST_F(StorageFaultTest, AFullDiskRefusesWritesKeepsReadsAndResumesOnceSpaceIsFreed) {
  auto tmp = TempDir::Create();
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  const std::string mnt = (*tmp)->path() + "/tmpfs";
  TmpfsMount mount(mnt, 40);
  ASSERT_EQ(mount.error(), "") << "cannot run the full-disk test";
  // Room the test hands back later to end the outage.
  const std::string ballast = mnt + "/ballast";
  {
    std::ofstream out(ballast, std::ios::binary);
    std::string mib(1 << 20, 'b');
    for (int i = 0; i < 8; ++i) out << mib;
    ASSERT_TRUE(out.good()) << "writing the ballast";
  }

  ASSERT_NO_FATAL_FAILURE(Start({.data_dir = mnt + "/data"}));

  // Fill the disk.
  std::vector<std::pair<std::string, int>> acked;  // job id, payload index
  grpc::Status refused;
  int i = 0;
  for (; i < 400; ++i) {
    v1::EnqueueRequest req;
    req.set_queue(kQueue);
    req.set_payload(Payload(i));
    v1::EnqueueResponse resp;
    grpc::Status s = client().Enqueue(req, &resp);
    if (!s.ok()) {
      refused = s;
      break;
    }
    acked.emplace_back(resp.job_id(), i);
  }
  ASSERT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.error_message() << " after " << i << " enqueues";
  EXPECT_THAT(refused.error_message(), HasSubstr("storage is full"));
  ASSERT_FALSE(acked.empty());

  // Every change is refused now, with a message that says what to do.
  {
    v1::EnqueueRequest req;
    req.set_queue(kQueue);
    req.set_payload("small");
    v1::EnqueueResponse resp;
    grpc::Status s = client().Enqueue(req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("writes resume when space is freed"));
    v1::LeaseRequest lease;
    lease.set_queue(kQueue);
    lease.set_worker_id("w");
    v1::LeaseResponse leased;
    EXPECT_EQ(client().Lease(lease, &leased).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  // Reads answer, and readiness, metrics and the log say why writes do not.
  v1::Job job;
  ASSERT_TRUE(client().GetJob(acked.front().first, &job).ok());
  EXPECT_EQ(job.payload(), Payload(acked.front().second));
  v1::QueueInfo info;
  EXPECT_TRUE(client().GetQueue(kQueue, &info).ok());
  EXPECT_EQ(ReadyzStatus(process()), 503);
  EXPECT_EQ(Health(process(), "jobbroker.v1.Broker"), 2) << "NOT_SERVING while writes are refused";
  EXPECT_EQ(Health(process(), ""), 1) << "the process is alive: liveness must not restart it";
  std::string metrics = HttpGet(process().http_address(), "/metrics");
  EXPECT_EQ(Sample(metrics, "jobbroker_storage_writable"), 0) << metrics;
  EXPECT_GE(Sample(metrics, "jobbroker_storage_errors_total{kind=\"no_space\"}"), 1) << metrics;
  EXPECT_THAT(process().ReadStderr(), HasSubstr("\"event\":\"store_write_failed\""));

  // Free space: writes come back without a restart.
  ASSERT_TRUE(std::filesystem::remove(ballast));
  grpc::Status resumed;
  std::string resumed_id;
  WaitFor(
      [&] {
        v1::EnqueueRequest req;
        req.set_queue(kQueue);
        req.set_payload("after");
        v1::EnqueueResponse resp;
        resumed = client().Enqueue(req, &resp);
        if (resumed.ok()) resumed_id = resp.job_id();
        EXPECT_THAT(resumed, AnyOf(IsOk(), StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED)));
        return resumed.ok();
      },
      kResumeDeadline);
  ASSERT_TRUE(resumed.ok()) << "writes did not resume after space was freed: "
                            << resumed.error_message() << "\n"
                            << process().ReadStderr();
  EXPECT_THAT(process().ReadStderr(), HasSubstr("\"event\":\"store_resumed\""));
  EXPECT_EQ(ReadyzStatus(process()), 200);
  EXPECT_EQ(Health(process(), "jobbroker.v1.Broker"), 1);
  EXPECT_EQ(Sample(HttpGet(process().http_address(), "/metrics"), "jobbroker_storage_writable"), 1);

  // Nothing acknowledged was lost or changed: now, and after a restart from disk.
  auto check_all = [&](const char* when) {
    for (const auto& [id, index] : acked) {
      v1::Job j;
      grpc::Status s = client().GetJob(id, &j);
      ASSERT_TRUE(s.ok()) << when << ": " << id << ": " << s.error_message();
      EXPECT_EQ(j.state(), v1::JOB_STATE_READY) << when << ": " << id;
      EXPECT_TRUE(j.payload() == Payload(index)) << when << ": payload of " << id;
    }
    v1::Job after;
    EXPECT_TRUE(client().GetJob(resumed_id, &after).ok()) << when;
  };
  check_all("after the resume");
  ASSERT_NO_FATAL_FAILURE(Restart());
  check_all("after a restart");
  EXPECT_TRUE(process().Terminate().ok());
}

// The store's key layout (storage/rocksdb_store.h) lets the test reach the record directly.
void CorruptJobRecord(const std::string& dir, const std::string& job_id) {
  rocksdb::DBOptions options;
  std::vector<std::string> names;
  ASSERT_TRUE(rocksdb::DB::ListColumnFamilies(options, dir, &names).ok());
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const std::string& n : names) descriptors.emplace_back(n, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, descriptors, &handles, &db);
  ASSERT_TRUE(s.ok()) << s.ToString();
  rocksdb::ColumnFamilyHandle* jobs = nullptr;
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == storage::kRocksDbJobsColumnFamily) jobs = handles[i];
  ASSERT_NE(jobs, nullptr);
  // A one-partition store: every key starts with partition 0's prefix.
  const std::string key = storage::PartitionKeyPrefix(0) + job_id;
  std::string value;
  ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), jobs, key, &value).ok());
  // Flip every byte: no longer a JobRecord, and nothing of the payload is left readable.
  for (char& c : value) c = static_cast<char>(~c);
  rocksdb::WriteOptions sync;
  sync.sync = true;
  ASSERT_TRUE(db->Put(sync, jobs, key, value).ok());
  for (rocksdb::ColumnFamilyHandle* h : handles) ASSERT_TRUE(db->DestroyColumnFamilyHandle(h).ok());
  ASSERT_TRUE(db->Close().ok());
  delete db;
}

TEST_F(StorageFaultTest, ACorruptJobRecordIsReportedAndTheBrokerServesTheRest) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const std::string bad = client().MustEnqueue("q", "secret-payload-of-the-bad-job");
  const std::string good = client().MustEnqueue("q", "fine");
  auto stopped = process().Terminate();
  ASSERT_TRUE(stopped.ok() && *stopped == 0) << stopped.status();

  CorruptJobRecord(process().data_dir(), bad);

  ASSERT_NO_FATAL_FAILURE(Restart()) << "a corrupt record must not stop the start";
  v1::Job job;
  grpc::Status s = client().GetJob(bad, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("is corrupt"));
  EXPECT_THAT(s.error_message(), HasSubstr(bad));
  // One log line naming the key, never the payload.
  const std::string log = process().ReadStderr();
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(log, '\n'))
    if (absl::StrContains(line, "\"event\":\"corrupt_record\"")) lines.emplace_back(line);
  ASSERT_EQ(lines.size(), 1u) << log;
  EXPECT_THAT(lines[0], HasSubstr(bad));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("secret-payload")));
  EXPECT_EQ(Sample(HttpGet(process().http_address(), "/metrics"), "jobbroker_corrupt_records"), 1);
  EXPECT_EQ(ReadyzStatus(process()), 200);

  // Everything else works.
  EXPECT_EQ(client().MustGetJob(good).payload(), "fine");
  auto leased = client().LeaseOne("q", "w");
  ASSERT_TRUE(leased.has_value());
  EXPECT_EQ(leased->job_id(), good);
  client().MustAck(*leased);
  client().MustEnqueue("q", "more");
  // The operator removes the record.
  EXPECT_TRUE(client().DeleteJob(bad).ok());
  EXPECT_EQ(client().GetJob(bad, &job).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Sample(HttpGet(process().http_address(), "/metrics"), "jobbroker_corrupt_records"), 0);
}

// A data directory as a build before partitions (store format 1) left it: one waiting job, its
// dedup key and a paused queue's policy, keyed without a partition.
void MakeFormat1Directory(const std::string& dir, const core::Job& job) {
  rocksdb::DBOptions options;
  options.create_if_missing = true;
  options.create_missing_column_families = true;
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const std::string& n : {std::string(rocksdb::kDefaultColumnFamilyName),
                               std::string(storage::kRocksDbJobsColumnFamily),
                               std::string(storage::kRocksDbDedupColumnFamily),
                               std::string(storage::kRocksDbPoliciesColumnFamily)})
    descriptors.emplace_back(n, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, descriptors, &handles, &db);
  ASSERT_TRUE(s.ok()) << s.ToString();
  rocksdb::WriteOptions sync;
  sync.sync = true;
  core::DedupEntry dedup;
  dedup.queue = job.queue;
  dedup.key = job.dedup_key;
  dedup.job_id = job.id;
  dedup.expires_at = absl::Now() + absl::Hours(1);
  dedup.payload_hash = core::PayloadHash(job.payload);
  core::PolicyOverride paused;
  paused.paused = true;
  ASSERT_TRUE(db->Put(sync, handles[0], storage::kRocksDbFormatKey, "1").ok());
  ASSERT_TRUE(db->Put(sync, handles[1], job.id, storage::EncodeJob(job)).ok());
  ASSERT_TRUE(db->Put(sync, handles[2], job.queue + std::string(1, '\0') + job.dedup_key,
                      storage::EncodeDedup(dedup))
                  .ok());
  ASSERT_TRUE(db->Put(sync, handles[3], "held", storage::EncodePolicy(paused)).ok());
  for (rocksdb::ColumnFamilyHandle* h : handles) ASSERT_TRUE(db->DestroyColumnFamilyHandle(h).ok());
  ASSERT_TRUE(db->Close().ok());
  delete db;
}

TEST_F(StorageFaultTest, AFormat1DataDirectoryIsUpgradedAndItsJobsAreServed) {
  auto tmp = TempDir::Create();
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  const std::string dir = (*tmp)->path() + "/old-data";
  core::Job old;
  old.id = "01HF3Z8K2QZZZZXYV7W5R4N3M2";  // random bits where the partition is now
  old.queue = "q";
  old.payload = "from-format-1";
  old.dedup_key = "order-7";
  old.seq = 1;
  old.max_attempts = 3;
  old.created_at = absl::Now() - absl::Minutes(1);
  old.run_at = old.created_at;
  ASSERT_NO_FATAL_FAILURE(MakeFormat1Directory(dir, old));

  ASSERT_NO_FATAL_FAILURE(Start({.data_dir = dir}));
  EXPECT_THAT(process().ReadStderr(), HasSubstr("\"event\":\"store_upgraded\""));
  EXPECT_EQ(client().MustGetJob(old.id).payload(), "from-format-1");
  // Its dedup key is still held, and the paused queue is still paused.
  v1::EnqueueRequest again;
  again.set_queue("q");
  again.set_payload("from-format-1");
  again.set_dedup_key("order-7");
  v1::EnqueueResponse resp;
  ASSERT_TRUE(client().Enqueue(again, &resp).ok());
  EXPECT_TRUE(resp.deduplicated());
  EXPECT_EQ(resp.job_id(), old.id);
  v1::QueueInfo held;
  ASSERT_TRUE(client().GetQueue("held", &held).ok());
  EXPECT_TRUE(held.policy().paused());
  // The old job runs as any other.
  auto leased = client().LeaseOne("q", "w");
  ASSERT_TRUE(leased.has_value());
  EXPECT_EQ(leased->job_id(), old.id);
  client().MustAck(*leased);
  const std::string fresh = client().MustEnqueue("q", "new");
  ASSERT_NO_FATAL_FAILURE(Restart());
  EXPECT_THAT(process().ReadStderr(), ::testing::Not(HasSubstr("store_upgraded")))
      << "upgraded once";
  EXPECT_EQ(client().MustGetJob(old.id).state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(client().MustGetJob(fresh).payload(), "new");
}

}  // namespace
}  // namespace jobbroker::testing
