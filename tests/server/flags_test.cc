// The server's command line (server/config/flags.cc): what scripts and the chart pass must keep
// meaning what it meant, and a bad value is refused naming the flag.
#include "server/config/flags.h"

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace jobbroker::server {

using ::jobbroker::testing::IsOk;
using ::jobbroker::testing::StatusIs;

namespace {

using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

absl::StatusOr<ServerFlags> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "jobbroker");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return ParseFlags(static_cast<int>(argv.size()), argv.data());
}

TEST(FlagsTest, NoFlagsGiveTheDocumentedDefaults) {
  absl::StatusOr<ServerFlags> f = Parse({});
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(f->listen, "127.0.0.1:7070");
  EXPECT_EQ(f->http_listen, "127.0.0.1:8080");
  EXPECT_EQ(f->data_dir, "./data");
  EXPECT_EQ(f->config, "");
  EXPECT_EQ(f->log_level, "info");
  EXPECT_EQ(f->log_format, "json");
  EXPECT_EQ(f->metrics, "on");
  EXPECT_EQ(f->max_work_streams, 10000);
  EXPECT_EQ(f->max_hot_jobs, 100'000);
  EXPECT_EQ(f->keepalive_time, 10);
  EXPECT_EQ(f->keepalive_timeout, 5);
  EXPECT_EQ(f->metrics_max_queues, 1000);
  EXPECT_EQ(f->partitions, 1);
  EXPECT_FALSE(f->check_config);
  EXPECT_FALSE(f->help);
}

TEST(FlagsTest, BothTheSpacedAndTheEqualsFormSetAValue) {
  absl::StatusOr<ServerFlags> f =
      Parse({"--listen", "127.0.0.1:0", "--data-dir=/tmp/d", "--max-hot-jobs", "0"});
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(f->listen, "127.0.0.1:0");
  EXPECT_EQ(f->data_dir, "/tmp/d");
  EXPECT_EQ(f->max_hot_jobs, 0);
}

TEST(FlagsTest, AFlagNotGivenAgainFallsBackToItsDefault) {
  ASSERT_THAT(Parse({"--listen", "0.0.0.0:1"}), IsOk());
  EXPECT_EQ(Parse({})->listen, "127.0.0.1:7070");
}

TEST(FlagsTest, CheckConfigAndHelpStandAlone) {
  absl::StatusOr<ServerFlags> f = Parse({"--check-config", "--data-dir", "d"});
  ASSERT_THAT(f, IsOk());
  EXPECT_TRUE(f->check_config);
  EXPECT_EQ(f->data_dir, "d") << "--check-config took no value";
  EXPECT_TRUE(Parse({"-h"})->help);
  EXPECT_TRUE(Parse({"--help"})->help);
}

TEST(FlagsTest, AnEmptyConfigIsAllowedButNoOtherEmptyValue) {
  EXPECT_THAT(Parse({"--config", ""}), IsOk());
  EXPECT_THAT(Parse({"--data-dir", ""}),
              StatusIs(kInvalid, HasSubstr("--data-dir must not be empty")));
}

TEST(FlagsTest, UnknownFlagsAndMissingValuesAreRefusedNamingTheFlag) {
  EXPECT_THAT(Parse({"--no-such-flag", "1"}),
              StatusIs(kInvalid, HasSubstr("unknown flag --no-such-flag")));
  EXPECT_THAT(Parse({"--data_dir", "d"}), StatusIs(kInvalid, HasSubstr("unknown flag --data_dir")))
      << "flags are spelt with '-'";
  EXPECT_THAT(Parse({"--listen"}), StatusIs(kInvalid, HasSubstr("--listen needs a value")));
}

TEST(FlagsTest, NumbersOutOfRangeOrNotNumbersAreRefusedWithTheRange) {
  for (const char* bad : {"0", "-1", "many", "1000001", "99999999999"}) {
    EXPECT_THAT(
        Parse({"--max-work-streams", bad}),
        StatusIs(kInvalid, HasSubstr("--max-work-streams must be a number from 1 to 1000000")))
        << bad;
  }
  EXPECT_THAT(
      Parse({"--max-hot-jobs=lots"}),
      StatusIs(kInvalid, HasSubstr("--max-hot-jobs must be a number from 0 to 1000000000")));
  EXPECT_THAT(Parse({"--metrics-max-queues", "-1"}),
              StatusIs(kInvalid, HasSubstr("--metrics-max-queues must be a number")));
  for (const char* bad : {"0", "32769"}) {
    EXPECT_THAT(Parse({"--partitions", bad}),
                StatusIs(kInvalid, HasSubstr("--partitions must be a number from 1 to 32768")))
        << bad;
  }
  EXPECT_EQ(Parse({"--partitions", "8"})->partitions, 8);
  EXPECT_THAT(Parse({"--keepalive-time", "0"}),
              StatusIs(kInvalid, HasSubstr("--keepalive-time must be a number from 1 to 3600")));
  EXPECT_THAT(Parse({"--keepalive-timeout", "601"}),
              StatusIs(kInvalid, HasSubstr("--keepalive-timeout must be a number from 1 to 600")));
  EXPECT_EQ(Parse({"--keepalive-time=2"})->keepalive_time, 2);
}

TEST(FlagsTest, ClusterModeIsOffByDefaultAndItsFlagsAreCheckedTogether) {
  absl::StatusOr<ServerFlags> f = Parse({});
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(f->cluster_etcd, "") << "a single node unless etcd is given";
  EXPECT_EQ(f->cluster_name, "jobbroker");
  EXPECT_EQ(f->cluster_lease_ttl, 3);
  EXPECT_EQ(f->cluster_etcd_wait, 60) << "etcd may start after the nodes";
  EXPECT_EQ(f->replication_factor, 3);
  EXPECT_EQ(f->min_in_sync, 2);
  EXPECT_EQ(f->cluster_initial_nodes, 0) << "placed once --replication-factor nodes are up";

  f = Parse({"--cluster-etcd", "http://127.0.0.1:2379", "--node-id", "a", "--advertise-address",
             "10.0.0.1:7070", "--replication-factor", "1", "--min-in-sync", "1",
             "--cluster-initial-nodes", "3"});
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(f->node_id, "a");
  EXPECT_EQ(f->advertise_address, "10.0.0.1:7070");
  EXPECT_EQ(f->replication_factor, 1);
  EXPECT_EQ(f->cluster_initial_nodes, 3);

  EXPECT_THAT(Parse({"--cluster-etcd", "http://127.0.0.1:2379"}),
              StatusIs(kInvalid, HasSubstr("--cluster-etcd needs --node-id")));
  EXPECT_THAT(Parse({"--node-id", "a/b"}), StatusIs(kInvalid, HasSubstr("--node-id")));
  EXPECT_THAT(Parse({"--min-in-sync", "3", "--replication-factor", "2"}),
              StatusIs(kInvalid, HasSubstr("--min-in-sync (3) must not exceed")));
  EXPECT_THAT(Parse({"--cluster-lease-ttl", "1"}),
              StatusIs(kInvalid, HasSubstr("--cluster-lease-ttl must be a number from 2 to 60")));
  EXPECT_THAT(Parse({"--cluster-etcd-wait", "3601"}),
              StatusIs(kInvalid, HasSubstr("--cluster-etcd-wait must be a number from 0 to 3600")));
  EXPECT_EQ(Parse({"--cluster-etcd-wait", "0"})->cluster_etcd_wait, 0);
  EXPECT_THAT(Parse({"--replication-factor", "8"}),
              StatusIs(kInvalid, HasSubstr("--replication-factor must be a number from 1 to 7")));
  EXPECT_THAT(
      Parse({"--cluster-initial-nodes", "-1"}),
      StatusIs(kInvalid, HasSubstr("--cluster-initial-nodes must be a number from 0 to 1024")));
  // With tokens on, a node must bring the token it presents to the others.
  EXPECT_THAT(Parse({"--cluster-etcd", "http://127.0.0.1:2379", "--node-id", "a", "--auth-tokens",
                     "tokens.json"}),
              StatusIs(kInvalid, HasSubstr("needs --cluster-peer-token-file")));
  EXPECT_THAT(Parse({"--cluster-peer-token-file", "peer.token"}),
              StatusIs(kInvalid, HasSubstr("--cluster-peer-token-file is for cluster mode")));
  f = Parse({"--cluster-etcd", "http://127.0.0.1:2379", "--node-id", "a", "--auth-tokens",
             "tokens.json", "--cluster-peer-token-file", "peer.token"});
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(f->cluster_peer_token_file, "peer.token");
  // Nodes dial each other in plain text: a TLS listener would cut them apart.
  EXPECT_THAT(Parse({"--cluster-etcd", "http://127.0.0.1:2379", "--node-id", "a", "--tls-cert",
                     "c.pem", "--tls-key", "k.pem"}),
              StatusIs(kInvalid, HasSubstr("cluster mode does not take gRPC over TLS yet")));
}

TEST(FlagsTest, PeerAddressesAreIdEqualsHostPortPairs) {
  absl::StatusOr<ServerFlags> f =
      Parse({"--cluster-etcd", "http://127.0.0.1:2379", "--node-id", "a",
             "--cluster-peer-addresses", "b=127.0.0.1:9001,c=proxy:9002"});
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(f->cluster_peer_addresses,
            (std::map<std::string, std::string>{{"b", "127.0.0.1:9001"}, {"c", "proxy:9002"}}));
  for (const char* bad : {"b", "=127.0.0.1:1", "b=", "b=host-without-port"}) {
    EXPECT_THAT(Parse({"--cluster-etcd", "http://127.0.0.1:2379", "--node-id", "a",
                       "--cluster-peer-addresses", bad}),
                StatusIs(kInvalid, HasSubstr("--cluster-peer-addresses")))
        << bad;
  }
  EXPECT_THAT(Parse({"--cluster-peer-addresses", "b=127.0.0.1:9001"}),
              StatusIs(kInvalid, HasSubstr("--cluster-peer-addresses is for cluster mode")));
}

TEST(FlagsTest, TlsFilesThatOnlyWorkTogetherAreRefusedAlone) {
  EXPECT_THAT(Parse({"--tls-cert", "c.pem"}),
              StatusIs(kInvalid, HasSubstr("--tls-cert and --tls-key go together")));
  EXPECT_THAT(Parse({"--tls-client-ca", "ca.pem"}),
              StatusIs(kInvalid, HasSubstr("--tls-client-ca needs")));
  EXPECT_THAT(Parse({"--http-tls-key", "k.pem"}),
              StatusIs(kInvalid, HasSubstr("--http-tls-cert and --http-tls-key go together")));
}

TEST(FlagsTest, HelpListsEveryFlagWithItsDefault) {
  const std::string usage = Usage();
  for (const char* flag : {"--listen",
                           "--http-listen",
                           "--data-dir",
                           "--config",
                           "--log-level",
                           "--log-format",
                           "--metrics",
                           "--metrics-max-queues",
                           "--tls-cert",
                           "--tls-key",
                           "--tls-client-ca",
                           "--http-tls-cert",
                           "--http-tls-key",
                           "--http-tls-client-ca",
                           "--auth-tokens",
                           "--max-work-streams",
                           "--max-hot-jobs",
                           "--check-config",
                           "--cluster-etcd",
                           "--cluster-name",
                           "--node-id",
                           "--advertise-address",
                           "--cluster-lease-ttl",
                           "--replication-factor",
                           "--min-in-sync",
                           "--cluster-initial-nodes",
                           "--cluster-peer-token-file",
                           "--cluster-peer-addresses",
                           "--help"}) {
    EXPECT_THAT(usage, HasSubstr(std::string("  ") + flag)) << flag;
  }
  EXPECT_THAT(usage, HasSubstr("--data-dir  (default \"./data\")"));
  EXPECT_THAT(usage, HasSubstr("--max-work-streams  (default 10000)"));
}

}  // namespace
}  // namespace jobbroker::server
