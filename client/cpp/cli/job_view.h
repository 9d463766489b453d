#pragma once

#include <string>

#include "absl/time/time.h"
#include "jobbroker/v1/job.pb.h"

namespace jobbroker::cli {

// The `get` command's view of a job: one "field: value" line each, then its attempts as a
// table. Times are shown in UTC and relative to `now`; payload and result as text when they are
// printable, else their size. Ends in '\n'.
std::string FormatJob(const v1::Job& job, absl::Time now);

}  // namespace jobbroker::cli
