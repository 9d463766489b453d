#include "cluster/transport/wire.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "storage/record_codec.h"

namespace jobbroker::cluster {
namespace {

void SetPosition(const LogPosition& in, v1::LogPosition* out) {
  out->set_seq(in.seq);
  out->set_epoch(in.epoch);
}

LogPosition Position(const v1::LogPosition& in) { return {in.seq(), in.epoch()}; }

absl::Status Invalid(const std::string& field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("replication frame: ", field, ": ", why));
}

struct ToWireBody {
  v1::ReplicationFrame& frame;

  void operator()(const AppendRequest& in) const {
    v1::AppendRequest& out = *frame.mutable_append();
    out.set_epoch(in.epoch);
    SetPosition(in.prev, out.mutable_prev());
    out.set_commit_seq(in.commit_seq);
    for (const LogEntry& entry : in.entries) {
      v1::LogEntry& wire = *out.add_entries();
      wire.set_seq(entry.seq);
      wire.set_record(storage::EncodeLogEntry(entry.epoch, entry.transition));
    }
  }
  void operator()(const SnapshotChunk& in) const {
    v1::SnapshotChunk& out = *frame.mutable_snapshot_chunk();
    out.set_epoch(in.epoch);
    SetPosition(in.at, out.mutable_at());
    out.set_index(in.index);
    out.set_last(in.last);
    out.set_records(storage::EncodeLogEntry(in.epoch, in.records));
  }
  void operator()(const AppendResponse& in) const {
    v1::AppendResponse& out = *frame.mutable_append_response();
    out.set_epoch(in.epoch);
    switch (in.result) {
      case AppendResponse::Result::kMatched:
        out.set_result(v1::AppendResponse::MATCHED);
        break;
      case AppendResponse::Result::kMismatch:
        out.set_result(v1::AppendResponse::MISMATCH);
        break;
      case AppendResponse::Result::kStaleEpoch:
        out.set_result(v1::AppendResponse::STALE_EPOCH);
        break;
    }
    out.set_match_seq(in.match_seq);
    out.set_retry_from(in.retry_from);
  }
  void operator()(const SnapshotAck& in) const {
    v1::SnapshotAck& out = *frame.mutable_snapshot_ack();
    out.set_epoch(in.epoch);
    SetPosition(in.at, out.mutable_at());
    out.set_next_index(in.next_index);
  }
};

absl::StatusOr<AppendRequest> FromWire(const v1::AppendRequest& in, uint32_t partition) {
  AppendRequest out;
  out.epoch = in.epoch();
  out.prev = Position(in.prev());
  out.commit_seq = in.commit_seq();
  out.entries.reserve(in.entries_size());
  for (int i = 0; i < in.entries_size(); ++i) {
    const v1::LogEntry& wire = in.entries(i);
    const std::string field = absl::StrCat("append.entries[", i, "]");
    if (wire.seq() != out.prev.seq + 1 + static_cast<uint64_t>(i)) {
      return Invalid(field + ".seq", absl::StrCat(wire.seq(), " does not follow prev.seq ",
                                                  out.prev.seq, " in order"));
    }
    absl::StatusOr<storage::DecodedLogEntry> entry =
        storage::DecodeLogEntry(partition, wire.seq(), wire.record());
    if (!entry.ok()) return Invalid(field + ".record", entry.status().message());
    out.entries.push_back({wire.seq(), entry->epoch, std::move(entry->transition)});
  }
  return out;
}

absl::StatusOr<SnapshotChunk> FromWire(const v1::SnapshotChunk& in, uint32_t partition) {
  SnapshotChunk out;
  out.epoch = in.epoch();
  out.at = Position(in.at());
  out.index = in.index();
  out.last = in.last();
  absl::StatusOr<storage::DecodedLogEntry> records =
      storage::DecodeLogEntry(partition, 0, in.records());
  if (!records.ok()) return Invalid("snapshot_chunk.records", records.status().message());
  const core::Transition& t = records->transition;
  if (!t.delete_jobs.empty() || !t.delete_dedup.empty() || !t.delete_policies.empty()) {
    return Invalid("snapshot_chunk.records", "a snapshot chunk holds puts only");
  }
  out.records = std::move(records->transition);
  return out;
}

absl::StatusOr<AppendResponse> FromWire(const v1::AppendResponse& in) {
  AppendResponse out;
  out.epoch = in.epoch();
  switch (in.result()) {
    case v1::AppendResponse::MATCHED:
      out.result = AppendResponse::Result::kMatched;
      break;
    case v1::AppendResponse::MISMATCH:
      out.result = AppendResponse::Result::kMismatch;
      break;
    case v1::AppendResponse::STALE_EPOCH:
      out.result = AppendResponse::Result::kStaleEpoch;
      break;
    default:
      return Invalid("append_response.result", absl::StrCat("unknown result ", in.result()));
  }
  out.match_seq = in.match_seq();
  out.retry_from = in.retry_from();
  return out;
}

SnapshotAck FromWire(const v1::SnapshotAck& in) {
  return {in.epoch(), Position(in.at()), in.next_index()};
}

}  // namespace

v1::ReplicationFrame ToWire(const ReplicationMessage& message) {
  v1::ReplicationFrame frame;
  frame.set_from(message.from);
  frame.set_to(message.to);
  frame.set_partition(message.partition);
  std::visit(ToWireBody{frame}, message.body);
  return frame;
}

absl::StatusOr<ReplicationMessage> FromWire(const v1::ReplicationFrame& frame) {
  if (frame.from().empty()) return Invalid("from", "empty");
  if (frame.to().empty()) return Invalid("to", "empty");
  ReplicationMessage message;
  message.from = frame.from();
  message.to = frame.to();
  message.partition = frame.partition();
  switch (frame.body_case()) {
    case v1::ReplicationFrame::kAppend: {
      absl::StatusOr<AppendRequest> body = FromWire(frame.append(), frame.partition());
      if (!body.ok()) return body.status();
      message.body = *std::move(body);
      break;
    }
    case v1::ReplicationFrame::kSnapshotChunk: {
      absl::StatusOr<SnapshotChunk> body = FromWire(frame.snapshot_chunk(), frame.partition());
      if (!body.ok()) return body.status();
      message.body = *std::move(body);
      break;
    }
    case v1::ReplicationFrame::kAppendResponse: {
      absl::StatusOr<AppendResponse> body = FromWire(frame.append_response());
      if (!body.ok()) return body.status();
      message.body = *body;
      break;
    }
    case v1::ReplicationFrame::kSnapshotAck:
      message.body = FromWire(frame.snapshot_ack());
      break;
    default:
      return Invalid("body", "none this build knows");
  }
  return message;
}

}  // namespace jobbroker::cluster
