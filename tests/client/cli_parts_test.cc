// The CLI's parts that need no broker: argument parsing, value parsers, tables and formatting.
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/cpp/cli/args.h"
#include "client/cpp/cli/cluster_view.h"
#include "client/cpp/cli/format.h"
#include "client/cpp/cli/table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobbroker/client.h"

namespace jobbroker::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::vector<FlagSpec> kSpecs = {
    {"--priority", "N", "priority"},
    {"--header", "K=V", "header", true},
    {"--json", "", "json"},
};

TEST(ParseArgsTest, SplitsPositionalsAndFlagsInBothForms) {
  absl::StatusOr<ParsedArgs> p = ParseArgs(
      {"q", "--priority", "-5", "payload", "--header=a=1", "--header", "b=2", "--json"}, kSpecs);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->positional, ElementsAre("q", "payload"));
  EXPECT_EQ(p->Get("--priority"), "-5");
  EXPECT_THAT(p->GetAll("--header"), ElementsAre("a=1", "b=2"));
  EXPECT_TRUE(p->Has("--json"));
  EXPECT_FALSE(p->Get("--missing").has_value());
}

TEST(ParseArgsTest, DashIsPositionalAndDoubleDashEndsFlags) {
  absl::StatusOr<ParsedArgs> p = ParseArgs({"q", "-", "--", "--json"}, kSpecs);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->positional, ElementsAre("q", "-", "--json"));
  EXPECT_FALSE(p->Has("--json"));
}

TEST(ParseArgsTest, StopsAtTheFirstPositionalWhenAsked) {
  absl::StatusOr<ParsedArgs> p =
      ParseArgs({"--json", "get", "--priority", "1"}, kSpecs, /*stop_at_positional=*/true);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->Has("--json"));
  EXPECT_THAT(p->positional, ElementsAre("get", "--priority", "1"));
}

TEST(ParseArgsTest, RefusesUnknownFlagsMissingValuesAndValuedBooleans) {
  EXPECT_THAT(ParseArgs({"--nope"}, kSpecs).status().message(), HasSubstr("unknown flag --nope"));
  EXPECT_THAT(ParseArgs({"--priority"}, kSpecs).status().message(),
              HasSubstr("--priority needs a value"));
  EXPECT_THAT(ParseArgs({"--json=yes"}, kSpecs).status().message(),
              HasSubstr("--json takes no value"));
}

TEST(ValueParsersTest, DurationsIntsAndTimes) {
  EXPECT_EQ(ParseDurationValue("--d", "1.5s").value(), absl::Milliseconds(1500));
  EXPECT_EQ(ParseDurationValue("--d", "200ms").value(), absl::Milliseconds(200));
  EXPECT_EQ(ParseDurationValue("--d", "1h30m").value(), absl::Minutes(90));
  EXPECT_EQ(ParseDurationValue("--d", "10").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseDurationValue("--d", "inf").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseIntValue("--n", "42", 0, 100).value(), 42);
  EXPECT_THAT(ParseIntValue("--n", "101", 0, 100).status().message(), HasSubstr("[0, 100]"));
  EXPECT_EQ(ParseIntValue("--n", "4x", 0, 100).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTimeValue("--t", "2030-01-02T03:04:05Z").value(),
            absl::FromCivil(absl::CivilSecond(2030, 1, 2, 3, 4, 5), absl::UTCTimeZone()));
  EXPECT_EQ(ParseTimeValue("--t", "tomorrow").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TableTest, PadsColumnsAndRightAlignsNumbers) {
  Table table({"NAME", "COUNT", "NOTE"});
  table.AlignRight(1);
  table.AddRow({"emails", "7", "ok"});
  table.AddRow({"ü", "1234", ""});
  EXPECT_EQ(table.Render(),
            "NAME    COUNT  NOTE\n"
            "emails      7  ok\n"
            "ü        1234\n");
}

TEST(FormatTest, AgesAreCompact) {
  EXPECT_EQ(FormatAge(absl::Milliseconds(850)), "850ms");
  EXPECT_EQ(FormatAge(absl::Seconds(42)), "42s");
  EXPECT_EQ(FormatAge(absl::Seconds(192)), "3m12s");
  EXPECT_EQ(FormatAge(absl::Minutes(125)), "2h5m");
  EXPECT_EQ(FormatAge(absl::Hours(76)), "3d4h");
  EXPECT_EQ(FormatAge(absl::Seconds(-5)), "-5s");
}

TEST(FormatTest, EnumNamesAndStates) {
  EXPECT_EQ(StateName(v1::JOB_STATE_READY), "READY");
  EXPECT_EQ(OutcomeName(v1::ATTEMPT_OUTCOME_LEASE_EXPIRED), "LEASE_EXPIRED");
  EXPECT_EQ(OutcomeName(v1::ATTEMPT_OUTCOME_UNSPECIFIED), "RUNNING");
  EXPECT_EQ(ParseState("failed").value(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(ParseState("JOB_STATE_ACTIVE").value(), v1::JOB_STATE_ACTIVE);
  EXPECT_THAT(ParseState("done").status().message(),
              HasSubstr("ready|scheduled|active|completed|failed|cancelled"));
}

TEST(FormatTest, PrintableShowsTextAndSizesBinary) {
  EXPECT_EQ(Printable("a\nb", 10), "a\\nb");
  EXPECT_EQ(Printable("héllo wörld", 5), "héllo...");
  EXPECT_EQ(Printable(std::string("\x00\x01", 2), 10), "<2 bytes, binary>");
  EXPECT_EQ(Printable("", 10), "(empty)");
  EXPECT_EQ(OneLine("line one\nline two", 12), "line one lin...");
}

TEST(ClusterViewTest, ListsNodesAndPartitionsWithTheirLeaders) {
  v1::ClusterInfo info;
  info.set_cluster_name("prod");
  info.set_partition_count(2);
  info.set_replication_factor(3);
  info.set_min_in_sync(2);
  info.set_node_id("b");
  for (const char* id : {"a", "b"}) {
    v1::NodeInfo* node = info.add_nodes();
    node->set_node_id(id);
    node->set_address(std::string(id) + ".example:7070");
    node->set_alive(std::string(id) == "a");
  }
  v1::PartitionInfo* p0 = info.add_partitions();
  p0->set_partition(0);
  p0->set_leader_node_id("a");
  p0->set_epoch(1234);
  for (const char* id : {"a", "b"}) p0->add_replicas(id);
  p0->add_in_sync("a");
  v1::PartitionInfo* p1 = info.add_partitions();
  p1->set_partition(1);
  p1->add_replicas("b");
  EXPECT_EQ(FormatCluster(info),
            "cluster prod: 2 partitions, replication factor 3, min in-sync 2; answered by b\n"
            "\n"
            "NODE  ADDRESS         ALIVE\n"
            "a     a.example:7070  yes\n"
            "b     b.example:7070  no\n"
            "\n"
            "PARTITION  LEADER  EPOCH  REPLICAS  IN SYNC\n"
            "        0  a        1234  a,b       a\n"
            "        1  -           -  b\n");

  info.clear_cluster_name();
  EXPECT_THAT(FormatCluster(info), ::testing::StartsWith("single broker (not a cluster), "
                                                         "answered by b\n"));
}

TEST(AddressListTest, SplitsOnCommasAndDropsBlanks) {
  EXPECT_THAT(client::SplitAddresses("h1:1, h2:2 ,,h3:3,"), ElementsAre("h1:1", "h2:2", "h3:3"));
  EXPECT_THAT(client::SplitAddresses("localhost:7070"), ElementsAre("localhost:7070"));
  EXPECT_THAT(client::SplitAddresses(" , "), ::testing::IsEmpty());
}

}  // namespace
}  // namespace jobbroker::cli
