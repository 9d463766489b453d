#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/testing/child_process.h"

namespace jobbroker::jepsen {

// A Toxiproxy server (scripts/install-toxiproxy.sh) run as a child, and the two calls of its
// HTTP API the harness needs: a proxy per link, and cutting a link (the proxy disabled: its
// connections are closed and new ones refused) and mending it. Stopped when the object dies.
class Toxiproxy {
 public:
  // Starts `binary` with its API on 127.0.0.1:`api_port` and waits until it answers.
  static absl::StatusOr<std::unique_ptr<Toxiproxy>> Start(const std::string& binary, int api_port,
                                                          const std::string& log_path);

  // A proxy `name` listening at `listen` (host:port) that relays to `upstream`.
  absl::Status Create(const std::string& name, const std::string& listen,
                      const std::string& upstream);
  // Cuts (false) or mends (true) the link.
  absl::Status SetEnabled(const std::string& name, bool enabled);

 private:
  Toxiproxy(std::string api, std::unique_ptr<testing::ChildProcess> process)
      : api_(std::move(api)), process_(std::move(process)) {}

  const std::string api_;  // host:port
  std::unique_ptr<testing::ChildProcess> process_;
};

}  // namespace jobbroker::jepsen
