#pragma once

#include "absl/status/statusor.h"
#include "cluster/replication/messages.h"
#include "cluster/transport/replication.pb.h"

namespace jobbroker::cluster {

// cluster/replication's messages as Replication frames (replication.proto) and back. The log
// entries and snapshot records travel as storage's LogEntryRecord bytes, checked by its decoder.
v1::ReplicationFrame ToWire(const ReplicationMessage& message);

// kInvalidArgument naming the field for a frame this build cannot take whole: no body, an
// unknown result, entries whose seqs do not follow prev, a record that does not decode. A
// frame that decodes is delivered as it is; the replica checks what it means (epochs, matches).
absl::StatusOr<ReplicationMessage> FromWire(const v1::ReplicationFrame& frame);

}  // namespace jobbroker::cluster
