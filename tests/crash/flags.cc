#include "tests/crash/flags.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace jobbroker::crash {

absl::StatusOr<Flags> Flags::Parse(int argc, char** argv, int first) {
  Flags flags;
  for (int i = first; i < argc; i += 2) {
    const std::string name = argv[i];
    if (!absl::StartsWith(name, "--") || i + 1 >= argc) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": expected --name value"));
    }
    flags.values_[name.substr(2)] = argv[i + 1];
  }
  return flags;
}

std::string Flags::String(const std::string& name, const std::string& fallback) {
  used_[name] = true;
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<int64_t> Flags::Int(const std::string& name, int64_t fallback) {
  used_[name] = true;
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": not an integer: ", it->second));
  }
  return v;
}

absl::StatusOr<uint64_t> Flags::Uint(const std::string& name, uint64_t fallback) {
  used_[name] = true;
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  uint64_t v;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": not an unsigned integer: ", it->second));
  }
  return v;
}

absl::StatusOr<absl::Duration> Flags::Duration(const std::string& name, absl::Duration fallback) {
  used_[name] = true;
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  absl::Duration d;
  if (!absl::ParseDuration(it->second, &d) || d < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": not a duration like 1.5s: ", it->second));
  }
  return d;
}

std::string Flags::Unused() const {
  for (const auto& [name, value] : values_) {
    if (!used_.contains(name)) return name;
  }
  return "";
}

}  // namespace jobbroker::crash
