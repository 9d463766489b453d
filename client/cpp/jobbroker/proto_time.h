#pragma once

#include <google/protobuf/duration.pb.h>
#include <google/protobuf/timestamp.pb.h>

#include "absl/time/time.h"

namespace jobbroker::client {

// absl <-> google.protobuf time types. Exact to the nanosecond within the proto range; the
// proto side keeps seconds and nanos of the same sign, as the wire format requires.
google::protobuf::Duration ToProtoDuration(absl::Duration d);
google::protobuf::Timestamp ToProtoTimestamp(absl::Time t);
absl::Duration FromProtoDuration(const google::protobuf::Duration& d);
absl::Time FromProtoTimestamp(const google::protobuf::Timestamp& t);

// True when `t` is set to something other than the epoch: the broker leaves a time it has not
// got (no lease yet, not ended) unset, which reads back as 0.
inline bool IsSet(const google::protobuf::Timestamp& t) {
  return t.seconds() != 0 || t.nanos() != 0;
}

}  // namespace jobbroker::client
