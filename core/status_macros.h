#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Debian's Abseil 20220623 has no status macros; these are the two we need.

// Returns the status of `expr` from the enclosing function unless it is OK.
#define BROKER_RETURN_IF_ERROR(expr)                   \
  do {                                                 \
    if (absl::Status s_ = (expr); !s_.ok()) return s_; \
  } while (0)

// `lhs = *expr` if `expr` (an absl::StatusOr) holds a value; else returns its status from the
// enclosing function. `lhs` may declare a variable: BROKER_ASSIGN_OR_RETURN(Job* job, Find(id));
#define BROKER_ASSIGN_OR_RETURN(lhs, expr) \
  BROKER_ASSIGN_OR_RETURN_IMPL_(BROKER_STATUS_CONCAT_(statusor_, __LINE__), lhs, expr)

#define BROKER_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = *std::move(statusor)
#define BROKER_STATUS_CONCAT_(a, b) BROKER_STATUS_CONCAT_INNER_(a, b)
#define BROKER_STATUS_CONCAT_INNER_(a, b) a##b
