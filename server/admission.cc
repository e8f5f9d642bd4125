#include "server/admission.h"

#include <chrono>

namespace infoflow::server {

absl::Status Admission::Acquire(const std::function<bool()>& cancelled) {
  std::unique_lock<std::mutex> lock(mu_);
  if (free_ > 0 && waiting_ == 0) {
    --free_;
    ++admitted_;
    return absl::OkStatus();
  }
  if (waiting_ >= queue_depth_) {
    return absl::ResourceExhaustedError("server busy: query queue is full (--queue-depth)");
  }
  ++waiting_;
  while (free_ == 0) {
    cv_.wait_for(lock, std::chrono::milliseconds(20));
    if (free_ == 0 && cancelled()) {
      --waiting_;
      return absl::CancelledError("cancelled while waiting for a worker");
    }
  }
  --waiting_;
  --free_;
  ++admitted_;
  return absl::OkStatus();
}

void Admission::Release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++free_;
  }
  cv_.notify_one();
}

int Admission::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_;
}

uint64_t Admission::admitted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return admitted_;
}

bool Admission::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_ == 0 && free_ == workers_;
}

}  // namespace infoflow::server
