#include "jobbroker/proto_time.h"

#include <cstdint>

namespace jobbroker::client {

google::protobuf::Duration ToProtoDuration(absl::Duration d) {
  google::protobuf::Duration out;
  // IDivDuration truncates toward zero, so the remainder has the sign of `d`.
  const int64_t seconds = absl::IDivDuration(d, absl::Seconds(1), &d);
  out.set_seconds(seconds);
  out.set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(d)));
  return out;
}

google::protobuf::Timestamp ToProtoTimestamp(absl::Time t) {
  const timespec ts = absl::ToTimespec(t);
  google::protobuf::Timestamp out;
  out.set_seconds(ts.tv_sec);
  out.set_nanos(static_cast<int32_t>(ts.tv_nsec));
  return out;
}

absl::Duration FromProtoDuration(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

absl::Time FromProtoTimestamp(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

}  // namespace jobbroker::client
