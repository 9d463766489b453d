#include "client/cpp/cli/args.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace jobbroker::cli {

bool ParsedArgs::Has(absl::string_view name) const { return flags.count(std::string(name)) > 0; }

std::optional<std::string> ParsedArgs::Get(absl::string_view name) const {
  auto it = flags.find(std::string(name));
  if (it == flags.end() || it->second.empty()) return std::nullopt;
  return it->second.back();
}

std::vector<std::string> ParsedArgs::GetAll(absl::string_view name) const {
  auto it = flags.find(std::string(name));
  return it == flags.end() ? std::vector<std::string>{} : it->second;
}

void ParsedArgs::MergeFlags(const ParsedArgs& other) {
  for (const auto& [name, values] : other.flags) {
    std::vector<std::string>& mine = flags[name];
    mine.insert(mine.end(), values.begin(), values.end());
  }
}

absl::StatusOr<ParsedArgs> ParseArgs(absl::Span<const std::string> args,
                                     absl::Span<const FlagSpec> specs, bool stop_at_positional) {
  ParsedArgs parsed;
  bool flags_ended = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const bool is_flag = !flags_ended && arg.size() > 1 && arg[0] == '-';
    if (!is_flag) {
      if (stop_at_positional) {
        parsed.positional.assign(args.begin() + i, args.end());
        break;
      }
      parsed.positional.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_ended = true;
      continue;
    }
    absl::string_view name = arg;
    std::optional<std::string> value;
    if (size_t eq = name.find('='); eq != absl::string_view::npos) {
      value = std::string(name.substr(eq + 1));
      name = name.substr(0, eq);
    }
    auto spec = std::find_if(specs.begin(), specs.end(),
                             [name](const FlagSpec& s) { return s.name == name; });
    if (spec == specs.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", name));
    }
    if (!spec->TakesValue()) {
      if (value.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(name, " takes no value"));
      }
      value = "";
    } else if (!value.has_value()) {
      // The next argument is the value even if it starts with '-' (--priority -5).
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, " needs a value (", spec->value_name, ")"));
      }
      value = args[++i];
    }
    parsed.flags[spec->name].push_back(*std::move(value));
  }
  return parsed;
}

absl::StatusOr<absl::Duration> ParseDurationValue(absl::string_view flag, absl::string_view text) {
  absl::Duration d;
  if (!absl::ParseDuration(text, &d) || d == absl::InfiniteDuration() ||
      d == -absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": \"", text, "\" is not a duration (examples: 1.5s, 200ms, 10m, 2h, 1h30m)"));
  }
  return d;
}

absl::StatusOr<int64_t> ParseIntValue(absl::string_view flag, absl::string_view text, int64_t min,
                                      int64_t max) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(text, &n) || n < min || n > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": \"", text, "\" is not an integer in [", min, ", ", max, "]"));
  }
  return n;
}

absl::StatusOr<absl::Time> ParseTimeValue(absl::string_view flag, absl::string_view text) {
  absl::Time t;
  std::string why;
  if (!absl::ParseTime(absl::RFC3339_full, text, &t, &why)) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": \"", text, "\" is not an RFC 3339 time like 2030-01-02T15:04:05Z (", why, ")"));
  }
  return t;
}

}  // namespace jobbroker::cli
