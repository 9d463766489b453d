#pragma once

#include <atomic>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace jobbroker::testing {

// A TCP relay on a loopback port to `target` ("127.0.0.1:PORT"), for tests of what a silent
// link does: while Freeze()d it moves no byte either way but keeps every connection open, as a
// firewall that drops packets or a peer that froze would (the kernel still acknowledges what was
// sent: nothing is reset). Thaw() moves bytes again. One thread relays every connection.
class FrozenLink {
 public:
  static absl::StatusOr<std::unique_ptr<FrozenLink>> Start(const std::string& target);
  ~FrozenLink();
  FrozenLink(const FrozenLink&) = delete;
  FrozenLink& operator=(const FrozenLink&) = delete;

  // "127.0.0.1:PORT": where to connect instead of the target.
  const std::string& address() const { return address_; }
  void Freeze() { frozen_.store(true); }
  void Thaw() { frozen_.store(false); }
  // Connections accepted so far: a client that gave up a frozen one and connected again shows
  // here.
  int connections() const { return connections_.load(); }

 private:
  FrozenLink(int listener, int target_port, std::string address);
  void Relay();

  const int listener_;
  const int target_port_;
  const std::string address_;
  std::atomic<bool> frozen_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

}  // namespace jobbroker::testing
