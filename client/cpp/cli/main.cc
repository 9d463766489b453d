// jobbroker-cli: enqueue jobs and inspect a jobbroker from the shell. `jobbroker-cli help`
// lists the commands; run.h has the dispatcher, commands.h the commands.
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "client/cpp/cli/run.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  jobbroker::cli::Io io{.in = std::cin,
                        .out = std::cout,
                        .err = std::cerr,
                        .in_is_terminal = isatty(STDIN_FILENO) == 1};
  const int code = jobbroker::cli::RunCli(args, io);
  std::cout.flush();
  return code;
}
