#pragma once

#include <cstddef>
#include <deque>
#include <utility>

namespace jobbroker::server {

// The messages a server stream owes its client, written one at a time: gRPC's callback API takes
// one write in flight per stream, so a reactor queues what it sends from other threads and
// starts the next write when the last one is done. Shared by the streaming reactors (WorkStream,
// ProducerStream, JobWatchCall), each of which keeps its own rules for reads and for finishing.
//
// Not thread-safe: used under its reactor's mutex; the write itself (StartWrite) is started
// outside it, on the message NextToWrite returned, which stays in place until WriteDone.
template <typename Message>
class Outbox {
 public:
  void Push(Message message) {
    if (!closed_) queue_.push_back(std::move(message));
  }

  // The message to write now, marked as being written; null while a write is in flight, when
  // nothing is queued, or once the client is gone.
  const Message* NextToWrite() {
    if (writing_ || queue_.empty() || closed_) return nullptr;
    writing_ = true;
    return &queue_.front();
  }

  // The write NextToWrite started has ended. `ok` false: the client is gone, so what is queued
  // is dropped and nothing more is taken; returns `ok`.
  bool WriteDone(bool ok) {
    writing_ = false;
    queue_.pop_front();
    if (!ok) {
      closed_ = true;
      queue_.clear();
    }
    return ok;
  }

  bool writing() const { return writing_; }
  // Nothing queued and nothing being written: everything owed was sent.
  bool drained() const { return !writing_ && queue_.empty(); }
  size_t size() const { return queue_.size(); }
  // The queue, to merge what waits (WorkStream batches its pushes); only while not writing.
  std::deque<Message>& waiting() { return queue_; }

 private:
  std::deque<Message> queue_;
  bool writing_ = false;
  bool closed_ = false;
};

}  // namespace jobbroker::server
