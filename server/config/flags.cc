#include "server/config/flags.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

// The definitions: absl names them with '_' (data_dir); on the command line and in --help they
// are spelt with '-' (--data-dir), as they always were. Keep each help text to one line.
ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "gRPC address, HOST:PORT (port 0 picks a free port)");
ABSL_FLAG(std::string, http_listen, "127.0.0.1:8080",
          "HTTP address for /metrics, /healthz, /readyz and the dashboard, HOST:PORT");
ABSL_FLAG(std::string, data_dir, "./data", "where jobs are kept (RocksDB)");
ABSL_FLAG(std::string, config, "",
          "policies: a file of proto3 JSON of jobbroker.v1.ServerConfig (empty: built-in)");
ABSL_FLAG(std::string, log_level, "info", "debug | info | warn | error");
ABSL_FLAG(std::string, log_format, "json", "json (one object per line on stderr) | text");
ABSL_FLAG(std::string, metrics, "on", "on | off (off drops job, RPC and WAL metrics)");
ABSL_FLAG(int64_t, metrics_max_queues, 1000,
          "queues labelled by name in /metrics, 0 to 1000000 (0: all); later ones are counted "
          "together under queue=\"(other)\"");
ABSL_FLAG(std::string, tls_cert, "", "gRPC over TLS: the server's certificate chain (PEM)");
ABSL_FLAG(std::string, tls_key, "", "gRPC over TLS: its private key (PEM); needs --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "require gRPC client certificates signed by this CA (PEM): mutual TLS");
ABSL_FLAG(std::string, http_tls_cert, "", "HTTPS: the HTTP endpoint's certificate chain (PEM)");
ABSL_FLAG(std::string, http_tls_key, "", "HTTPS: its private key (PEM); needs --http-tls-cert");
ABSL_FLAG(std::string, http_tls_client_ca, "",
          "require HTTP client certificates signed by this CA (PEM): mutual TLS");
ABSL_FLAG(std::string, auth_tokens, "",
          "require a bearer token on every Broker and Admin call: a JSON file of tokens (their "
          "SHA-256), each with roles and queue patterns");
ABSL_FLAG(int, max_work_streams, 10000,
          "open Work streams allowed at once, over all workers, 1 to 1000000");
ABSL_FLAG(int64_t, keepalive_time, 10,
          "seconds without a frame from a client or another node before it is pinged, 1 to 3600");
ABSL_FLAG(int64_t, keepalive_timeout, 5,
          "seconds a ping waits for its answer before the connection and its calls are given up "
          "(a frozen or cut-off peer), 1 to 600");
ABSL_FLAG(int64_t, max_hot_jobs, 100'000,
          "jobs kept whole in memory (about 1 KB each), 0 to 1000000000; waiting jobs past it "
          "take about 90 bytes each and are read from disk when leased");
ABSL_FLAG(int64_t, partitions, 1,
          "partitions of a new --data-dir, 1 to 32768: each is a broker of its own with its own "
          "lock (queues are spread by a hash of their name); a data dir keeps the count it was "
          "created with");
ABSL_FLAG(std::string, cluster_etcd, "",
          "cluster mode: etcd's client URLs, comma-separated (http://host:port); empty: a "
          "single node");
ABSL_FLAG(std::string, cluster_name, "jobbroker",
          "cluster mode: the cluster's name, the prefix of its keys in etcd");
ABSL_FLAG(std::string, node_id, "",
          "cluster mode: this node's id, unique in the cluster and the same across restarts");
ABSL_FLAG(std::string, advertise_address, "",
          "cluster mode: HOST:PORT where the other nodes reach this node's gRPC (empty: "
          "--listen)");
ABSL_FLAG(int64_t, cluster_lease_ttl, 3,
          "cluster mode: seconds a node's etcd lease lives without renewal, 2 to 60; a dead "
          "leader's partitions get a new one after about this long");
ABSL_FLAG(int64_t, cluster_etcd_wait, 60,
          "cluster mode: seconds a starting node waits for etcd to answer, 0 to 3600 (0: one "
          "try); etcd and the nodes may then be started together, in any order");
ABSL_FLAG(int64_t, replication_factor, 3,
          "cluster mode: replicas of each partition, 1 to 7 (fixed when the cluster is created)");
ABSL_FLAG(int64_t, min_in_sync, 2,
          "cluster mode: replicas a write must be durable on before it is answered, 1 to "
          "--replication-factor (fixed when the cluster is created)");
ABSL_FLAG(int64_t, cluster_initial_nodes, 0,
          "cluster mode: nodes that must have registered before a new cluster places its "
          "partitions on them, 0 to 1024 (0: --replication-factor); give every node of a new "
          "cluster the count it starts with, or the first nodes up get every partition");
ABSL_FLAG(std::string, cluster_peer_token_file, "",
          "cluster mode with --auth-tokens: a file holding the token this node presents to the "
          "others (one with the peer role in every node's --auth-tokens); required then");
ABSL_FLAG(std::string, cluster_peer_addresses, "",
          "cluster mode: ID=HOST:PORT,... peers this node dials somewhere else than the address "
          "they advertise (a proxy, a NAT or a sidecar between nodes); others: as advertised");
ABSL_FLAG(bool, check_config, false,
          "validate the flags, the --config file and the TLS files, say so, exit (0 if the broker "
          "would start with them, 1 otherwise)");

namespace jobbroker::server {
namespace {

// The numeric flags' ranges: a value that does not parse gets the same message as one out of
// range, naming the flag.
struct Range {
  absl::string_view name;  // absl's
  int64_t min;
  int64_t max;

  bool Holds(int64_t value) const { return value >= min && value <= max; }
};
constexpr Range kMaxWorkStreams = {"max_work_streams", 1, 1'000'000};
constexpr Range kMaxHotJobs = {"max_hot_jobs", 0, 1'000'000'000};
constexpr Range kKeepaliveTime = {"keepalive_time", 1, 3600};
constexpr Range kKeepaliveTimeout = {"keepalive_timeout", 1, 600};
constexpr Range kMetricsMaxQueues = {"metrics_max_queues", 0, 1'000'000};
constexpr Range kPartitions = {"partitions", 1, 32768};
constexpr Range kClusterLeaseTtl = {"cluster_lease_ttl", 2, 60};
constexpr Range kClusterEtcdWait = {"cluster_etcd_wait", 0, 3600};
constexpr Range kReplicationFactor = {"replication_factor", 1, 7};
constexpr Range kMinInSync = {"min_in_sync", 1, 7};
constexpr Range kClusterInitialNodes = {"cluster_initial_nodes", 0, 1024};
constexpr Range kRanges[] = {kMaxWorkStreams,   kMaxHotJobs,         kKeepaliveTime,
                             kKeepaliveTimeout, kMetricsMaxQueues,   kPartitions,
                             kClusterLeaseTtl,  kClusterEtcdWait,    kReplicationFactor,
                             kMinInSync,        kClusterInitialNodes};

std::string Spelt(absl::string_view absl_name) {
  return absl::StrCat("--", absl::StrReplaceAll(absl_name, {{"_", "-"}}));
}

// Whether `flag` is one of those defined above, not one of a library's. Compared with what absl
// reports for one of ours, not with __FILE__: absl normalizes the file name it reports (it drops
// a leading '/'), so an absolute __FILE__ never equals it.
bool IsOurs(const absl::CommandLineFlag& flag) {
  static const std::string ours = absl::GetFlagReflectionHandle(FLAGS_listen).Filename();
  return flag.Filename() == ours;
}

// The flags defined above, by their absl name.
std::vector<absl::CommandLineFlag*> OurFlags() {
  std::vector<absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsOurs(*flag)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  return flags;
}

// "--data-dir" -> the data_dir flag; nullptr if it is none of ours.
absl::CommandLineFlag* FindFlag(absl::string_view arg) {
  if (!absl::ConsumePrefix(&arg, "--") || absl::StrContains(arg, '_')) return nullptr;
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(absl::StrReplaceAll(arg, {{"-", "_"}}));
  return flag != nullptr && IsOurs(*flag) ? flag : nullptr;
}

absl::Status OutOfRange(const Range& r) {
  return absl::InvalidArgumentError(
      absl::StrCat(Spelt(r.name), " must be a number from ", r.min, " to ", r.max));
}

// `text` as lines of at most kWidth columns, each indented by kIndent.
std::string Wrapped(absl::string_view text) {
  constexpr size_t kWidth = 96;
  constexpr absl::string_view kIndent = "      ";
  std::string out;
  size_t column = 0;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (column > 0 && column + 1 + word.size() > kWidth) {
      out += "\n";
      column = 0;
    }
    absl::StrAppend(&out, column == 0 ? kIndent : " ", word);
    column += (column == 0 ? kIndent.size() : 1) + word.size();
  }
  return out + "\n";
}

}  // namespace

absl::StatusOr<ServerFlags> ParseFlags(int argc, char** argv) {
  std::string error;
  for (absl::CommandLineFlag* flag : OurFlags()) flag->ParseFrom(flag->DefaultValue(), &error);
  ServerFlags out;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      out.help = true;
      continue;
    }
    absl::string_view name = arg;
    std::optional<std::string> value;
    if (size_t eq = arg.find('='); eq != absl::string_view::npos) {
      name = arg.substr(0, eq);
      value = std::string(arg.substr(eq + 1));
    }
    absl::CommandLineFlag* flag = FindFlag(name);
    if (flag == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg));
    if (!value.has_value() && flag->IsOfType<bool>()) value = "true";
    if (flag->Name() == "partitions") out.partitions_given = true;
    if (!value.has_value()) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(name, " needs a value"));
      value = argv[++i];
    }
    if (value->empty() && name != "--config")
      return absl::InvalidArgumentError(absl::StrCat(name, " must not be empty"));
    if (!flag->ParseFrom(*value, &error)) {
      for (const Range& r : kRanges) {
        if (r.name == flag->Name()) return OutOfRange(r);
      }
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", error));
    }
  }
  out.listen = absl::GetFlag(FLAGS_listen);
  out.http_listen = absl::GetFlag(FLAGS_http_listen);
  out.data_dir = absl::GetFlag(FLAGS_data_dir);
  out.config = absl::GetFlag(FLAGS_config);
  out.log_level = absl::GetFlag(FLAGS_log_level);
  out.log_format = absl::GetFlag(FLAGS_log_format);
  out.metrics = absl::GetFlag(FLAGS_metrics);
  out.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  out.tls_key = absl::GetFlag(FLAGS_tls_key);
  out.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  out.http_tls_cert = absl::GetFlag(FLAGS_http_tls_cert);
  out.http_tls_key = absl::GetFlag(FLAGS_http_tls_key);
  out.http_tls_client_ca = absl::GetFlag(FLAGS_http_tls_client_ca);
  out.auth_tokens = absl::GetFlag(FLAGS_auth_tokens);
  out.max_work_streams = absl::GetFlag(FLAGS_max_work_streams);
  out.max_hot_jobs = absl::GetFlag(FLAGS_max_hot_jobs);
  out.keepalive_time = absl::GetFlag(FLAGS_keepalive_time);
  out.keepalive_timeout = absl::GetFlag(FLAGS_keepalive_timeout);
  out.metrics_max_queues = absl::GetFlag(FLAGS_metrics_max_queues);
  out.partitions = absl::GetFlag(FLAGS_partitions);
  out.check_config = absl::GetFlag(FLAGS_check_config);
  out.cluster_etcd = absl::GetFlag(FLAGS_cluster_etcd);
  out.cluster_name = absl::GetFlag(FLAGS_cluster_name);
  out.node_id = absl::GetFlag(FLAGS_node_id);
  out.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  out.cluster_lease_ttl = absl::GetFlag(FLAGS_cluster_lease_ttl);
  out.cluster_etcd_wait = absl::GetFlag(FLAGS_cluster_etcd_wait);
  out.replication_factor = absl::GetFlag(FLAGS_replication_factor);
  out.min_in_sync = absl::GetFlag(FLAGS_min_in_sync);
  out.cluster_initial_nodes = absl::GetFlag(FLAGS_cluster_initial_nodes);
  out.cluster_peer_token_file = absl::GetFlag(FLAGS_cluster_peer_token_file);
  for (absl::string_view entry :
       absl::StrSplit(absl::GetFlag(FLAGS_cluster_peer_addresses), ',', absl::SkipEmpty())) {
    const size_t eq = entry.find('=');
    if (eq == 0 || eq == absl::string_view::npos || eq + 1 == entry.size() ||
        entry.find(':', eq) == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cluster-peer-addresses: \"", entry, "\" is not ID=HOST:PORT"));
    }
    out.cluster_peer_addresses[std::string(entry.substr(0, eq))] =
        std::string(entry.substr(eq + 1));
  }

  if (!kMaxWorkStreams.Holds(out.max_work_streams)) return OutOfRange(kMaxWorkStreams);
  if (!kMaxHotJobs.Holds(out.max_hot_jobs)) return OutOfRange(kMaxHotJobs);
  if (!kKeepaliveTime.Holds(out.keepalive_time)) return OutOfRange(kKeepaliveTime);
  if (!kKeepaliveTimeout.Holds(out.keepalive_timeout)) return OutOfRange(kKeepaliveTimeout);
  if (!kMetricsMaxQueues.Holds(out.metrics_max_queues)) return OutOfRange(kMetricsMaxQueues);
  if (!kPartitions.Holds(out.partitions)) return OutOfRange(kPartitions);
  if (!kClusterLeaseTtl.Holds(out.cluster_lease_ttl)) return OutOfRange(kClusterLeaseTtl);
  if (!kClusterEtcdWait.Holds(out.cluster_etcd_wait)) return OutOfRange(kClusterEtcdWait);
  if (!kReplicationFactor.Holds(out.replication_factor)) return OutOfRange(kReplicationFactor);
  if (!kMinInSync.Holds(out.min_in_sync)) return OutOfRange(kMinInSync);
  if (!kClusterInitialNodes.Holds(out.cluster_initial_nodes))
    return OutOfRange(kClusterInitialNodes);
  if (out.min_in_sync > out.replication_factor) {
    return absl::InvalidArgumentError(absl::StrCat("--min-in-sync (", out.min_in_sync,
                                                   ") must not exceed --replication-factor (",
                                                   out.replication_factor, ")"));
  }
  if (!out.cluster_etcd.empty() && out.node_id.empty())
    return absl::InvalidArgumentError("--cluster-etcd needs --node-id (this node's id)");
  // With tokens on, the other nodes refuse a node that presents none.
  if (!out.cluster_etcd.empty() && !out.auth_tokens.empty() && out.cluster_peer_token_file.empty())
    return absl::InvalidArgumentError(
        "--cluster-etcd with --auth-tokens needs --cluster-peer-token-file (the token, with the "
        "peer role, this node presents to the others)");
  if (!out.cluster_peer_token_file.empty() && out.cluster_etcd.empty())
    return absl::InvalidArgumentError(
        "--cluster-peer-token-file is for cluster mode (--cluster-etcd)");
  // Nodes dial each other (replication, forwarding) without TLS for now: a node whose listener
  // demands it could not be reached by the others. Refused rather than a cluster that never
  // replicates.
  if (!out.cluster_etcd.empty() && !out.tls_cert.empty())
    return absl::InvalidArgumentError(
        "--tls-cert with --cluster-etcd: cluster mode does not take gRPC over TLS yet (nodes "
        "dial each other in plain text); put the nodes on a private network or a service mesh");
  if (!out.cluster_peer_addresses.empty() && out.cluster_etcd.empty())
    return absl::InvalidArgumentError(
        "--cluster-peer-addresses is for cluster mode (--cluster-etcd)");
  if (out.cluster_name.find('/') != std::string::npos)
    return absl::InvalidArgumentError("--cluster-name must not hold a '/'");
  if (out.node_id.find('/') != std::string::npos)
    return absl::InvalidArgumentError("--node-id must not hold a '/'");

  if (out.tls_cert.empty() != out.tls_key.empty())
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together: give both or neither");
  if (!out.tls_client_ca.empty() && out.tls_cert.empty())
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  if (out.http_tls_cert.empty() != out.http_tls_key.empty())
    return absl::InvalidArgumentError(
        "--http-tls-cert and --http-tls-key go together: give both or neither");
  if (!out.http_tls_client_ca.empty() && out.http_tls_cert.empty())
    return absl::InvalidArgumentError(
        "--http-tls-client-ca needs --http-tls-cert and --http-tls-key");
  return out;
}

std::string Usage() {
  std::string usage =
      "usage: jobbroker [--flag value | --flag=value]...\n"
      "  (e.g. jobbroker --data-dir ./data --listen 127.0.0.1:7070)\n\n";
  for (const absl::CommandLineFlag* flag : OurFlags()) {
    std::string default_value = flag->DefaultValue();
    if (flag->IsOfType<std::string>()) default_value = absl::StrCat("\"", default_value, "\"");
    absl::StrAppend(&usage, "  ", Spelt(flag->Name()), "  (default ", default_value, ")\n",
                    Wrapped(flag->Help()));
  }
  absl::StrAppend(&usage, "  --help, -h\n      print this and exit\n");
  return usage;
}

}  // namespace jobbroker::server
