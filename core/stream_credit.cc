#include "core/stream_credit.h"

#include <utility>

namespace jobbroker::core {

StreamCredit::StreamCredit(int max_in_flight, int members)
    : max_(max_in_flight),
      starved_(new std::atomic<bool>[members]),
      members_(members),
      refill_(members) {
  for (int i = 0; i < members_; ++i) starved_[i].store(false);
}

bool StreamCredit::TryTake(int member) {
  starved_[member].store(true);  // before the take: see the class comment
  int used = used_.load();
  while (used < max_.load()) {
    if (used_.compare_exchange_weak(used, used + 1)) {
      starved_[member].store(false);
      return true;
    }
  }
  return false;
}

bool StreamCredit::Give() {
  used_.fetch_sub(1);
  for (int i = 0; i < members_; ++i)
    if (starved_[i].load()) return true;
  return false;
}

void StreamCredit::SetRefill(int member, std::function<void()> refill) {
  absl::MutexLock lock(&mu_);
  refill_[member] = std::move(refill);
}

void StreamCredit::Refill() {
  std::vector<std::function<void()>> due;
  {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < members_; ++i) {
      if (refill_[i] && starved_[i].exchange(false)) due.push_back(refill_[i]);
    }
  }
  // Outside mu_: a refill leases, which may end holds, give credit and come back here.
  for (std::function<void()>& refill : due) refill();
}

}  // namespace jobbroker::core
