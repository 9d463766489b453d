#pragma once

#include "tests/crash/flags.h"

namespace jobbroker::crash {

// The child roles of the crash harness and of the cluster harness (tests/cluster/jepsen/): the
// rest of the command line after the role word, parsed and run; the exit code. Bad flags: 2.
//   producer --address A[,B..] --log F --name N --jobs J --seed S --spread D --queues Q,..
//   worker   --address A[,B..] --log F --id W --seed S --queues Q,.. [--heartbeat D]
int ProducerMain(Flags& flags);
int WorkerMain(Flags& flags);

}  // namespace jobbroker::crash
