#pragma once

#include "absl/status/status.h"

// Debian's Abseil 20220623 has no status macros; this is the one we need.
#define BROKER_RETURN_IF_ERROR(expr)                   \
  do {                                                 \
    if (absl::Status s_ = (expr); !s_.ok()) return s_; \
  } while (0)
