#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <utility>
#include <vector>

namespace jobbroker::server {

// The messages a server stream owes its client, written one at a time: gRPC's callback API takes
// one write in flight per stream, so a reactor queues what it sends from other threads and
// starts the next write when the last one is done. Shared by the streaming reactors (WorkStream,
// ProducerStream, JobWatchCall), each of which keeps its own rules for reads and for finishing.
//
// What will never be written (the message whose write failed, what waited behind it, what was
// pushed once the outbox closed) is kept as "unsent" until the owner takes it: a WorkStream gives
// the leases it carried back to the broker rather than leaving them to run out.
//
// Not thread-safe: used under its reactor's mutex; the write itself (StartWrite) is started
// outside it, on the message NextToWrite returned, which stays in place until WriteDone.
template <typename Message>
class Outbox {
 public:
  void Push(Message message) {
    if (closed_) {
      unsent_.push_back(std::move(message));
    } else {
      queue_.push_back(std::move(message));
    }
  }

  // The message to write now, marked as being written; null while a write is in flight, when
  // nothing is queued, or once the client is gone.
  const Message* NextToWrite() {
    if (writing_ || queue_.empty() || closed_) return nullptr;
    writing_ = true;
    return &queue_.front();
  }

  // The write NextToWrite started has ended. `ok` false: the client is gone, so that message and
  // what is queued become unsent, and so does anything pushed later; returns `ok`.
  bool WriteDone(bool ok) {
    writing_ = false;
    if (!ok) {
      closed_ = true;
      for (Message& m : queue_) unsent_.push_back(std::move(m));
      queue_.clear();
      return false;
    }
    queue_.pop_front();
    return true;
  }

  // Nothing more will be written (the client is gone, or the stream finished): what is queued
  // becomes unsent, but for a write in flight, which WriteDone settles.
  void Close() {
    if (closed_) return;
    closed_ = true;
    // Taken from the back: the message being written must stay where it is.
    const size_t keep = writing_ ? 1 : 0;
    const size_t first = unsent_.size();
    while (queue_.size() > keep) {
      unsent_.push_back(std::move(queue_.back()));
      queue_.pop_back();
    }
    std::reverse(unsent_.begin() + static_cast<std::ptrdiff_t>(first), unsent_.end());
  }

  // The messages that will never be written (in no promised order); the outbox forgets them.
  // (A vector: an empty one costs no allocation, and Pump asks on every call.)
  std::vector<Message> TakeUnsent() { return std::exchange(unsent_, {}); }

  bool writing() const { return writing_; }
  // Nothing queued and nothing being written: everything owed was sent.
  bool drained() const { return !writing_ && queue_.empty(); }
  size_t size() const { return queue_.size(); }
  // The queue, to merge what waits (WorkStream batches its pushes); only while not writing.
  std::deque<Message>& waiting() { return queue_; }

 private:
  std::deque<Message> queue_;
  std::vector<Message> unsent_;
  bool writing_ = false;
  bool closed_ = false;
};

}  // namespace jobbroker::server
