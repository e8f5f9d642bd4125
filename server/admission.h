// Admission control: at most `workers` requests compute at once and at most
// `queue_depth` wait for a slot; one more is refused at once
// (RESOURCE_EXHAUSTED) rather than queued without bound. Thread-safe.
#ifndef INFOFLOW_SERVER_ADMISSION_H_
#define INFOFLOW_SERVER_ADMISSION_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>

#include "absl/status/status.h"

namespace infoflow::server {

class Admission {
 public:
  Admission(int workers, int queue_depth)
      : free_(workers), workers_(workers), queue_depth_(queue_depth) {}

  // Takes a worker slot, waiting while `cancelled()` is false.
  // ResourceExhausted when the queue is full, Cancelled when `cancelled()`
  // turned true while waiting. On OK the caller must Release().
  absl::Status Acquire(const std::function<bool()>& cancelled);
  void Release();
  int waiting() const;
  // No request holds a slot or waits for one.
  bool idle() const;
  // Requests admitted since construction (a slot taken).
  uint64_t admitted() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int free_;
  int waiting_ = 0;
  uint64_t admitted_ = 0;
  const int workers_;
  const int queue_depth_;
};

// Holds a slot for a scope.
class AdmissionSlot {
 public:
  explicit AdmissionSlot(Admission* a) : a_(a) {}
  ~AdmissionSlot() {
    if (a_) a_->Release();
  }
  AdmissionSlot(const AdmissionSlot&) = delete;
  AdmissionSlot& operator=(const AdmissionSlot&) = delete;

 private:
  Admission* a_;
};

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_ADMISSION_H_
