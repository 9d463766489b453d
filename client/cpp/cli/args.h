#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace jobbroker::cli {

// One --flag a command accepts.
struct FlagSpec {
  // With the dashes: "--priority".
  std::string name;
  // Placeholder of the value in usage text ("N", "DURATION"); empty for a boolean flag.
  std::string value_name;
  std::string help;
  // May be given more than once, every value kept (--header). Otherwise the last one wins.
  bool repeatable = false;

  bool TakesValue() const { return !value_name.empty(); }
};

// A command line split into positional arguments and flags.
struct ParsedArgs {
  std::vector<std::string> positional;
  // Each flag given, with its values in command-line order; a boolean flag's value is "".
  std::map<std::string, std::vector<std::string>> flags;

  bool Has(absl::string_view name) const;
  // The last value of `name`, or nullopt if it was not given.
  std::optional<std::string> Get(absl::string_view name) const;
  // Every value of `name`, in order; empty if it was not given.
  std::vector<std::string> GetAll(absl::string_view name) const;
  // Adds `other`'s flags to these (its values after these ones).
  void MergeFlags(const ParsedArgs& other);
};

// Splits `args` by `specs`. A flag takes its value as "--name value" or "--name=value"; "--"
// makes every later argument positional; "-" alone is positional (it means stdin). With
// `stop_at_positional`, parsing stops at the first positional argument, which is returned with
// everything after it, unparsed, in `positional`.
//
// INVALID_ARGUMENT, with a message that names the flag, for an unknown flag, a missing value, or
// a value given to a boolean flag.
absl::StatusOr<ParsedArgs> ParseArgs(absl::Span<const std::string> args,
                                     absl::Span<const FlagSpec> specs,
                                     bool stop_at_positional = false);

// Flag value parsers. Each returns INVALID_ARGUMENT naming `flag` and the expected form.

// Go-style duration: "1.5s", "200ms", "10m", "2h", "1h30m". Must be finite.
absl::StatusOr<absl::Duration> ParseDurationValue(absl::string_view flag, absl::string_view text);
// A decimal integer in [min, max].
absl::StatusOr<int64_t> ParseIntValue(absl::string_view flag, absl::string_view text, int64_t min,
                                      int64_t max);
// RFC 3339: "2030-01-02T15:04:05Z", "2030-01-02T15:04:05.5+02:00".
absl::StatusOr<absl::Time> ParseTimeValue(absl::string_view flag, absl::string_view text);

}  // namespace jobbroker::cli
