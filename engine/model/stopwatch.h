// Wall-clock stage timings (the Report's stage times, TTFT) in milliseconds,
// on the monotonic clock.
#ifndef INFOFLOW_ENGINE_MODEL_STOPWATCH_H_
#define INFOFLOW_ENGINE_MODEL_STOPWATCH_H_

#include <chrono>

namespace infoflow {

// Milliseconds from `t0` to now.
inline double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Started at construction; Ms() is the time since then.
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double Ms() const { return MsSince(start_); }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_MODEL_STOPWATCH_H_
