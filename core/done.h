#pragma once

#include "absl/functional/any_invocable.h"

namespace jobbroker::core {

// The callback of an asynchronous Broker operation: runs exactly once, with the answer.
template <typename T>
using Done = absl::AnyInvocable<void(T)>;

}  // namespace jobbroker::core
