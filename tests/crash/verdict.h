#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tests/crash/checker.h"

namespace jobbroker::crash {

// The end of a harness run (the crash harness's and the cluster harness's): prints the
// checker's violations and the run's problems, then PASS or FAIL with the seed; removes
// `out_dir` after a green run unless `keep`. The exit code: 0 green, 1 otherwise.
int Verdict(const Report& report, const std::vector<std::string>& problems, uint64_t seed,
            const std::string& out_dir, bool keep);

}  // namespace jobbroker::crash
