#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace jobbroker::crash {

// "--name value" pairs of one command line. Each getter takes the flag (marking it used) or
// the default; Unused() names a flag nobody took, so a typo fails instead of being ignored.
class Flags {
 public:
  // INVALID_ARGUMENT for a word that is not "--name" followed by a value.
  static absl::StatusOr<Flags> Parse(int argc, char** argv, int first);

  bool Has(const std::string& name) const { return values_.contains(name); }
  std::string String(const std::string& name, const std::string& fallback);
  absl::StatusOr<int64_t> Int(const std::string& name, int64_t fallback);
  absl::StatusOr<uint64_t> Uint(const std::string& name, uint64_t fallback);
  absl::StatusOr<absl::Duration> Duration(const std::string& name, absl::Duration fallback);
  // The first flag no getter asked for; empty if none.
  std::string Unused() const;

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> used_;
};

}  // namespace jobbroker::crash
