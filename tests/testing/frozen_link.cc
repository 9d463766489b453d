#include "tests/testing/frozen_link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace jobbroker::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

// One relayed connection: the accepted client's socket and ours to the target.
struct Pair {
  int client = -1;
  int target = -1;
};

// Moves what `from` has to `to` (blocking write: loopback, small test traffic). False when
// either end closed.
bool Pump(int from, int to) {
  char buf[16384];
  const ssize_t n = read(from, buf, sizeof buf);
  if (n <= 0) return false;
  for (ssize_t done = 0; done < n;) {
    const ssize_t w = write(to, buf + done, static_cast<size_t>(n - done));
    if (w <= 0) return false;
    done += w;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FrozenLink>> FrozenLink::Start(const std::string& target) {
  int target_port = 0;
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(target.substr(colon + 1), &target_port))
    return absl::InvalidArgumentError(absl::StrCat("target: not HOST:PORT: ", target));
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = Loopback(0);
  socklen_t len = sizeof addr;
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(listener, 16) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (listener >= 0) close(listener);
    return absl::InternalError(absl::StrCat("relay listener: errno ", errno));
  }
  return std::unique_ptr<FrozenLink>(
      new FrozenLink(listener, target_port, absl::StrCat("127.0.0.1:", ntohs(addr.sin_port))));
}

FrozenLink::FrozenLink(int listener, int target_port, std::string address)
    : listener_(listener), target_port_(target_port), address_(std::move(address)) {
  thread_ = std::thread([this] { Relay(); });
}

FrozenLink::~FrozenLink() {
  stopping_.store(true);
  thread_.join();
  close(listener_);
}

void FrozenLink::Relay() {
  std::vector<Pair> pairs;
  while (!stopping_.load()) {
    const bool frozen = frozen_.load();
    std::vector<pollfd> fds = {{listener_, POLLIN, 0}};
    if (!frozen) {
      for (const Pair& p : pairs) {
        fds.push_back({p.client, POLLIN, 0});
        fds.push_back({p.target, POLLIN, 0});
      }
    }
    // A short timeout: Freeze, Thaw and the destructor are seen within it.
    if (poll(fds.data(), fds.size(), 20) <= 0) continue;
    const size_t polled = frozen ? 0 : pairs.size();
    if (fds[0].revents & POLLIN) {
      const int client = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client >= 0) {
        const int to = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in addr = Loopback(target_port_);
        if (to >= 0 && connect(to, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
          pairs.push_back({client, to});
          connections_.fetch_add(1);
        } else {
          close(client);
          if (to >= 0) close(to);
        }
      }
    }
    if (frozen) continue;
    std::vector<Pair> open(pairs.begin() + static_cast<std::ptrdiff_t>(polled), pairs.end());
    for (size_t i = 0; i < polled; ++i) {
      const pollfd& c = fds[1 + 2 * i];
      const pollfd& t = fds[2 + 2 * i];
      bool alive = true;
      if (c.revents & (POLLIN | POLLHUP | POLLERR)) alive = Pump(pairs[i].client, pairs[i].target);
      if (alive && (t.revents & (POLLIN | POLLHUP | POLLERR)))
        alive = Pump(pairs[i].target, pairs[i].client);
      if (alive) {
        open.push_back(pairs[i]);
      } else {
        close(pairs[i].client);
        close(pairs[i].target);
      }
    }
    pairs = std::move(open);
  }
  for (const Pair& p : pairs) {
    close(p.client);
    close(p.target);
  }
}

}  // namespace jobbroker::testing
