#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace jobbroker::server {

// The server's command line (DESIGN.md "Server flags"), as main.cc wires from it. The flags are
// defined with absl::flags in flags.cc, where each one's default and help live (--help is
// generated from them); ParseFlags copies their values here, so nothing else reads the absl
// flags.
struct ServerFlags {
  std::string listen;       // gRPC, HOST:PORT
  std::string http_listen;  // /metrics, /healthz, the dashboard
  std::string data_dir;
  std::string config;      // optional ServerConfig JSON file
  std::string log_level;   // debug | info | warn | error (checked by main.cc)
  std::string log_format;  // json | text (checked by main.cc)
  std::string metrics;     // on | off (off: no job/RPC/WAL metrics, for measuring cost)
  // gRPC over TLS: PEM files. Both or neither; tls_client_ca (mTLS) needs both.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;  // clients must present a certificate this CA signed
  // The HTTP endpoint (/metrics, /healthz, /readyz) over TLS, separately from gRPC: a scraper
  // may need another certificate than the workers. Same rules as the gRPC ones.
  std::string http_tls_cert;
  std::string http_tls_key;
  std::string http_tls_client_ca;
  // JSON file of bearer tokens with roles and queue patterns (server/auth/auth_tokens.h). Empty:
  // no authentication, every caller may call every RPC.
  std::string auth_tokens;
  // Open Work streams at once, over all clients (1 to 1000000).
  int max_work_streams = 0;
  // Jobs kept whole in memory (BrokerOptions::max_hot_jobs); past it, waiting jobs are index
  // entries only and are read back from disk when leased. 0 to 1000000000.
  int64_t max_hot_jobs = 0;
  // Keepalive of the gRPC server and of the channels to other nodes (server/grpc/keepalive.h):
  // seconds before a silent peer is pinged (1 to 3600), and before an unanswered ping closes
  // its connection (1 to 600).
  int64_t keepalive_time = 10;
  int64_t keepalive_timeout = 5;
  // Queues with a `queue` label of their own in /metrics (server/observability/queue_labels.h);
  // later ones are counted under queue="(other)". 0: no limit. 0 to 1000000.
  int64_t metrics_max_queues = 0;
  // Partitions of a new data directory (RocksDbStoreOptions::partitions); 1 to 32768.
  int64_t partitions = 1;
  bool partitions_given = false;  // on the command line (a data dir's own count wins; told if so)
  // Cluster mode (../shared/CLUSTER.md), on when cluster_etcd is set: etcd's URLs
  // (comma-separated), the cluster's key prefix, this node's id (needed then) and the address
  // its peers reach its gRPC at (empty: listen), its lease's TTL in seconds (2 to 60), and
  // what a new cluster is created with: replicas per partition (1 to 7) and the fewest in sync
  // a write needs (1 to replication_factor).
  std::string cluster_etcd;
  std::string cluster_name;
  std::string node_id;
  std::string advertise_address;
  int64_t cluster_lease_ttl = 3;
  // Seconds a starting node waits for etcd to answer (0 to 3600; 0: one try).
  int64_t cluster_etcd_wait = 60;
  int64_t replication_factor = 3;
  int64_t min_in_sync = 2;
  // Nodes registered before a new cluster places its partitions (0: replication_factor).
  int64_t cluster_initial_nodes = 0;
  // With auth_tokens: the file holding the token this node presents to its peers (peer role).
  std::string cluster_peer_token_file;
  // Peers dialled at another address than the one they advertise, by node id.
  std::map<std::string, std::string> cluster_peer_addresses;
  bool check_config = false;  // validate the flags and --config, print the verdict, exit
  bool help = false;          // --help or -h: print Usage() and exit 0
};

// Parses argv[1..]: "--flag value" and "--flag=value", flag names spelt with '-' as --help shows
// them; a bool flag (--check-config) stands alone or takes "=true"/"=false". Flags not given keep
// their defaults, also when this is called again. kInvalidArgument naming the flag: an unknown
// flag, a missing, empty (except --config) or out-of-range value, or flags that only make sense
// together (the TLS files).
absl::StatusOr<ServerFlags> ParseFlags(int argc, char** argv);

// The --help text, generated from the flag definitions: every flag, its help and its default.
std::string Usage();

}  // namespace jobbroker::server
