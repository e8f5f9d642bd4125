#include "server/scheduler.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/decode/decode.h"
#include "engine/model/model.h"
#include "engine/model/yield_point.h"
#include "server/metrics.h"
#include "server/prefilled_query.h"
#include "server/token_limit.h"

namespace infoflow::server {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(20);

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Exactly one thread computes on the device at a time. The prefill thread
// holds the baton while it works and, at a yield point, hands it to the
// decode loop when a step is waiting and the prefill has held the device for
// at least `prefill_slice` since it last took it; when both want it they
// alternate (one decode step, one slice of prefill), so neither starves.
// Why a slice: yield points come after every layer's attention and MLP, so
// handing over at each one made a short prefill (a few ms of work) wait for
// a dozen decode steps; with many short requests the prefill thread then
// became the bottleneck and decoders rarely overlapped (mean decode batch
// 4.6-5.8 at 16 streams, docs/DESIGN.md §12). A slice bounds the decode
// stall to about prefill_slice plus one step.
class DeviceBaton {
 public:
  explicit DeviceBaton(std::chrono::microseconds prefill_slice) : prefill_slice_(prefill_slice) {}
  void AcquireForDecode() { Acquire(Side::kDecode); }
  void AcquireForPrefill() { Acquire(Side::kPrefill); }
  void Release() {
    {
      std::lock_guard<std::mutex> l(mu_);
      held_ = false;
    }
    cv_.notify_all();
  }
  // Called by the prefill thread (holding the baton) at a yield point.
  void YieldToDecode() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!wants_[static_cast<int>(Side::kDecode)]) return;  // nobody decoding: go on
      if (Clock::now() - held_since_ < prefill_slice_) return;  // the slice is not used up
    }
    Release();
    AcquireForPrefill();
  }

 private:
  enum class Side { kDecode = 0, kPrefill = 1 };
  void Acquire(Side side) {
    std::unique_lock<std::mutex> l(mu_);
    const Side other = side == Side::kDecode ? Side::kPrefill : Side::kDecode;
    wants_[static_cast<int>(side)] = true;
    // Wait while held, or while the other side waits and we had the last turn.
    cv_.wait(l, [&] { return !held_ && !(wants_[static_cast<int>(other)] && last_ == side); });
    held_ = true;
    held_since_ = Clock::now();
    last_ = side;
    wants_[static_cast<int>(side)] = false;
  }

  const std::chrono::microseconds prefill_slice_;
  std::mutex mu_;
  Clock::time_point held_since_;
  std::condition_variable cv_;
  bool held_ = false;
  bool wants_[2] = {false, false};
  Side last_ = Side::kPrefill;
};

// One request, shared by the caller's gRPC thread and the scheduler threads.
struct Request {
  const QuerySpec* spec = nullptr;                                // a query, or
  const std::function<absl::Status(bool* more)>* step = nullptr;  // exclusive work (ingest)
  Clock::time_point enqueued = Clock::now();
  std::atomic<bool> cancel{false};  // the caller's client went away / deadline passed
  bool started = false;             // guarded by Impl::mu: left the queue
  bool admitted = false;            // guarded by Impl::mu: left it once (steps go back)

  // What the caller waits for; guarded by `mu`.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<int32_t, std::string>> tokens;  // streamed, not yet sunk
  bool finished = false;
  absl::Status status;
  QueryOutcome outcome;

  // Decode phase: touched only by the thread that holds the request (the
  // prefill thread, then the decode loop).
  std::unique_ptr<PrefilledQuery> prefilled;
  std::unique_ptr<DecodeState> state;
  NextToken next;
  int64_t kv_bytes = 0;  // reserved against max_kv_bytes
  bool got_token = false;
  Clock::time_point last_token;
};

}  // namespace

struct Scheduler::Impl {
  Impl(const Model* m, const QueryRunner* r, Metrics* me, const SchedulerOptions& o)
      : model(m),
        runner(r),
        metrics(me),
        options(o),
        baton(std::chrono::microseconds(static_cast<int64_t>(o.prefill_slice_ms * 1000))) {
    const ModelConfig& c = model->config();
    // K and V per layer per position in the compute dtype.
    kv_bytes_per_position = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim *
                            static_cast<int64_t>(c10::elementSize(model->dtype()));
  }

  // Scheduler::CheckRoom with `mu` held.
  absl::Status RoomLocked() const;
  // Queues `r`: after a room check, or, when `placed` (the caller used up a
  // held Place), in that place.
  absl::Status Enqueue(const std::shared_ptr<Request>& r, bool placed);
  // Scheduler::RunExclusiveInSteps, in a held place when `placed`.
  absl::Status RunSteps(const std::function<absl::Status(bool* more)>& step,
                        const std::function<bool()>& cancelled, bool placed);
  // Waits for `r` to finish, sinking its tokens; handles cancel.
  absl::Status Wait(const std::shared_ptr<Request>& r, const TokenSink* sink,
                    const std::function<bool()>& cancelled);
  void PrefillThread();
  void DecodeLoop();
  void RunPrefill(const std::shared_ptr<Request>& r);
  absl::Status ReserveKv(Request* r, int64_t positions);
  bool OnToken(Request* r, int32_t id, std::string_view text);
  // r->state->Advance(logits) into *next; an engine exception fails only
  // this request.
  absl::Status AdvanceGuarded(Request* r, const at::Tensor& logits, std::optional<NextToken>* next);
  // Frees the request's cache and KV reservation and wakes its caller.
  void Complete(Request* r, absl::Status status);

  const Model* model;
  const QueryRunner* runner;
  Metrics* metrics;
  const SchedulerOptions options;
  int64_t kv_bytes_per_position = 0;
  DeviceBaton baton;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Request>> queue;
  std::vector<std::shared_ptr<Request>> joining;  // prefilled, not yet in the batch
  int running = 0;
  int reserved = 0;  // held Places: queue entries to come
  uint64_t admitted = 0;
  int64_t kv_in_flight = 0;
  bool stop_prefill = false, stop_loop = false;
  std::thread prefill_thread, loop_thread;
};

absl::Status Scheduler::Impl::RoomLocked() const {
  if (stop_prefill) return absl::UnavailableError("server shutting down");
  // Requests that will find a free running slot do not count as queued.
  const int free_slots = std::max(0, options.max_running - running);
  if (static_cast<int>(queue.size()) + reserved - free_slots >= options.queue_depth) {
    return absl::ResourceExhaustedError("server busy: query queue is full (--queue-depth)");
  }
  return absl::OkStatus();
}

absl::Status Scheduler::Impl::Enqueue(const std::shared_ptr<Request>& r, bool placed) {
  {
    std::lock_guard<std::mutex> l(mu);
    if (placed) {
      --reserved;
      if (stop_prefill) return absl::UnavailableError("server shutting down");
    } else if (absl::Status room = RoomLocked(); !room.ok()) {
      return room;
    }
    queue.push_back(r);
  }
  cv.notify_all();
  return absl::OkStatus();
}

absl::Status Scheduler::Impl::RunSteps(const std::function<absl::Status(bool* more)>& step,
                                       const std::function<bool()>& cancelled, bool placed) {
  auto r = std::make_shared<Request>();
  r->step = &step;
  if (absl::Status s = Enqueue(r, placed); !s.ok()) return s;
  return Wait(r, nullptr, cancelled);
}

absl::Status Scheduler::Impl::Wait(const std::shared_ptr<Request>& r, const TokenSink* sink,
                                   const std::function<bool()>& cancelled) {
  while (true) {
    std::deque<std::pair<int32_t, std::string>> tokens;
    bool finished;
    {
      std::unique_lock<std::mutex> l(r->mu);
      r->cv.wait_for(l, kPoll, [&] { return !r->tokens.empty() || r->finished; });
      tokens.swap(r->tokens);
      finished = r->finished;
    }
    for (auto& [id, text] : tokens) {
      if (!r->cancel.load() && sink != nullptr && !(*sink)(id, text)) r->cancel = true;
    }
    if (finished) return r->status;
    if (!r->cancel.load() && cancelled && cancelled()) r->cancel = true;
    if (r->cancel.load()) {
      std::lock_guard<std::mutex> l(mu);
      if (!r->started) {
        queue.erase(std::find(queue.begin(), queue.end(), r));
        return absl::CancelledError("cancelled while waiting in the queue");
      }
    }
  }
}

void Scheduler::Impl::PrefillThread() {
  ScopedYieldPolicy policy({[this] { baton.YieldToDecode(); }, options.max_batch_tokens});
  while (true) {
    std::shared_ptr<Request> r;
    bool alone = false, first_turn = false;
    {
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return stop_prefill || (!queue.empty() && running < options.max_running); });
      if (stop_prefill) break;
      r = queue.front();
      queue.pop_front();
      r->started = true;
      ++running;
      first_turn = !r->admitted;
      if (first_turn) ++admitted;
      r->admitted = true;
      alone = running == 1;
    }
    // Nothing is decoding (this request is the only one past the queue),
    // and nothing can start to before this prefill ends: only this thread
    // moves requests into the batch. Yield points and row blocks would then
    // only cost time (smaller matmuls, attention in rounds), so the prefill
    // runs whole, as the engine does in-process.
    std::optional<ScopedYieldPolicy> whole;
    if (alone) whole.emplace(YieldPolicy{});
    if (metrics && first_turn) metrics->ObserveQueueWait(Seconds(Clock::now() - r->enqueued));
    if (r->cancel.load()) {
      Complete(r.get(), absl::CancelledError("cancelled while waiting in the queue"));
      continue;
    }
    baton.AcquireForPrefill();
    if (r->step != nullptr) {
      absl::Status s;
      bool more = false;
      try {
        s = (*r->step)(&more);
      } catch (const std::exception& e) {
        s = absl::InternalError(absl::StrCat("engine error: ", e.what()));
      }
      baton.Release();
      if (s.ok() && more) {
        // Back of the line, as admitted work: no queue-depth check again. A
        // caller that cancelled meanwhile gets CANCELLED from there (Wait
        // takes it out of the queue, or the pop above completes it), not OK
        // for a batch cut short.
        {
          std::lock_guard<std::mutex> l(mu);
          r->started = false;
          --running;
          queue.push_back(r);
        }
        cv.notify_all();
        continue;
      }
      Complete(r.get(), s);
      continue;
    }
    RunPrefill(r);
    baton.Release();
  }
  // Whatever is still queued will not run.
  std::deque<std::shared_ptr<Request>> left;
  {
    std::lock_guard<std::mutex> l(mu);
    left.swap(queue);
  }
  for (auto& r : left) Complete(r.get(), absl::UnavailableError("server shutting down"));
}

absl::Status Scheduler::Impl::ReserveKv(Request* r, int64_t positions) {
  const int64_t bytes = positions * kv_bytes_per_position;
  if (bytes > options.max_kv_bytes) {
    return TokenLimitError(
        absl::StatusCode::kOutOfRange,
        absl::StrCat("chunks + prompt + max_new_tokens: ", positions, " positions need ", bytes,
                     " bytes of KV cache, over the server's limit of ", options.max_kv_bytes,
                     " (--max-kv-bytes)"));
  }
  std::unique_lock<std::mutex> l(mu);
  if (kv_in_flight + bytes > options.max_kv_bytes) {
    // Wait for running queries to free theirs (FIFO: nothing behind this
    // request starts meanwhile); the decode loop keeps the device.
    l.unlock();
    baton.Release();
    l.lock();
    while (kv_in_flight + bytes > options.max_kv_bytes && !stop_prefill && !r->cancel.load()) {
      cv.wait_for(l, kPoll);
    }
    l.unlock();
    baton.AcquireForPrefill();
    l.lock();
    if (stop_prefill) return absl::UnavailableError("server shutting down");
    if (r->cancel.load()) return absl::CancelledError("cancelled while waiting for KV memory");
  }
  kv_in_flight += bytes;
  r->kv_bytes = bytes;
  return absl::OkStatus();
}

bool Scheduler::Impl::OnToken(Request* r, int32_t id, std::string_view text) {
  const Clock::time_point now = Clock::now();
  if (!r->got_token) {
    MarkFirstToken(r->prefilled.get());
    r->got_token = true;
  } else if (metrics && id >= 0) {
    metrics->ObserveInterToken(Seconds(now - r->last_token));
  }
  r->last_token = now;
  {
    std::lock_guard<std::mutex> l(r->mu);
    r->tokens.emplace_back(id, std::string(text));
  }
  r->cv.notify_all();
  return !r->cancel.load();
}

absl::Status Scheduler::Impl::AdvanceGuarded(Request* r, const at::Tensor& logits,
                                             std::optional<NextToken>* next) {
  try {
    *next = r->state->Advance(logits);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    next->reset();
    return absl::InternalError(absl::StrCat("engine error: ", e.what()));
  }
}

void Scheduler::Impl::RunPrefill(const std::shared_ptr<Request>& r) {
  absl::StatusOr<std::unique_ptr<PrefilledQuery>> q;
  try {
    q = runner->Prefill(*r->spec, [&](int64_t positions) { return ReserveKv(r.get(), positions); });
  } catch (const std::exception& e) {
    q = absl::InternalError(absl::StrCat("engine error: ", e.what()));
  }
  if (!q.ok()) {
    Complete(r.get(), q.status());
    return;
  }
  r->prefilled = *std::move(q);
  PrefilledQuery* p = r->prefilled.get();
  r->state = std::make_unique<DecodeState>(
      p->decode, runner->tokenizer(), p->next_position, model->config().max_position_embeddings,
      [this, req = r.get()](int32_t id, std::string_view text) { return OnToken(req, id, text); });
  // The first token comes from the prompt's logits: sample it here, before
  // the request joins the batch, so the batch does not delay it.
  std::optional<NextToken> next;
  absl::Status status = absl::OkStatus();
  if (r->cancel.load()) {
    r->state->Cancel();
  } else if (!r->state->done()) {
    status = AdvanceGuarded(r.get(), p->logits, &next);
  }
  p->logits = at::Tensor();
  if (!next) {
    Complete(r.get(), status);
    return;
  }
  r->next = *next;
  {
    std::lock_guard<std::mutex> l(mu);
    joining.push_back(r);
  }
  cv.notify_all();
}

void Scheduler::Impl::DecodeLoop() {
  std::vector<std::shared_ptr<Request>> batch;
  while (true) {
    {
      std::unique_lock<std::mutex> l(mu);
      if (batch.empty()) cv.wait(l, [&] { return stop_loop || !joining.empty(); });
      if (stop_loop) break;
      for (auto& r : joining) batch.push_back(std::move(r));
      joining.clear();
    }
    // Cancelled (client gone, deadline) requests leave before the step.
    for (auto it = batch.begin(); it != batch.end();) {
      if ((*it)->cancel.load()) {
        (*it)->state->Cancel();
        Complete(it->get(), absl::OkStatus());
        it = batch.erase(it);
      } else {
        ++it;
      }
    }
    if (batch.empty()) continue;
    const int64_t n = static_cast<int64_t>(batch.size());
    std::vector<int64_t> ids(n), positions(n);
    std::vector<KvCache*> caches(n);
    for (int64_t b = 0; b < n; ++b) {
      ids[b] = batch[b]->next.id;
      positions[b] = batch[b]->next.position;
      caches[b] = batch[b]->prefilled->cache.get();
    }
    if (metrics) metrics->ObserveBatchSize(static_cast<int>(n));
    baton.AcquireForDecode();
    at::Tensor logits;
    std::string error;
    try {
      logits = model->DecodeStep(at::tensor(ids), at::tensor(positions), caches);
    } catch (const std::exception& e) {
      error = e.what();
    }
    std::vector<std::shared_ptr<Request>> still;
    for (int64_t b = 0; b < n; ++b) {
      Request* r = batch[b].get();
      std::optional<NextToken> next;
      absl::Status status = absl::InternalError(absl::StrCat("engine error: ", error));
      if (error.empty()) status = AdvanceGuarded(r, logits[b], &next);
      if (next) {
        r->next = *next;
        still.push_back(std::move(batch[b]));
      } else {
        Complete(r, status);
      }
    }
    baton.Release();
    batch.swap(still);
  }
  for (auto& r : batch) {
    r->state->Cancel();
    Complete(r.get(), absl::UnavailableError("server shutting down"));
  }
}

void Scheduler::Impl::Complete(Request* r, absl::Status status) {
  if (r->prefilled) {
    r->prefilled->cache.reset();  // the KV memory goes now, not when the caller wakes
    if (r->state && status.ok()) {
      FinishOutcome(r->prefilled.get(), r->state->result());
      r->outcome = std::move(r->prefilled->outcome);
    }
  }
  if (r->started) {
    std::lock_guard<std::mutex> l(mu);
    kv_in_flight -= r->kv_bytes;
    r->kv_bytes = 0;
    --running;
  }
  cv.notify_all();
  {
    std::lock_guard<std::mutex> l(r->mu);
    r->status = std::move(status);
    r->finished = true;
  }
  r->cv.notify_all();
}

Scheduler::Scheduler(const Model* model, const QueryRunner* runner, Metrics* metrics,
                     const SchedulerOptions& options)
    : impl_(std::make_unique<Impl>(model, runner, metrics, options)) {
  impl_->loop_thread = std::thread([this] { impl_->DecodeLoop(); });
  impl_->prefill_thread = std::thread([this] { impl_->PrefillThread(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->stop_prefill = true;
  }
  impl_->cv.notify_all();
  impl_->prefill_thread.join();  // the loop keeps serving its yields until then
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->stop_loop = true;
  }
  impl_->cv.notify_all();
  impl_->loop_thread.join();
}

Scheduler::Place& Scheduler::Place::operator=(Place&& other) noexcept {
  if (this != &other) {
    GiveBack();
    impl_ = other.impl_;
    other.impl_ = nullptr;
  }
  return *this;
}

void Scheduler::Place::GiveBack() {
  if (impl_ == nullptr) return;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    --impl_->reserved;
  }
  impl_ = nullptr;
}

absl::StatusOr<Scheduler::Place> Scheduler::ReservePlace() {
  std::lock_guard<std::mutex> l(impl_->mu);
  if (absl::Status room = impl_->RoomLocked(); !room.ok()) return room;
  ++impl_->reserved;
  return Place(impl_.get());
}

bool Scheduler::TakePlace(Place* place) {
  if (place == nullptr || place->impl_ != impl_.get()) return false;
  place->impl_ = nullptr;  // still counted in `reserved` until Enqueue
  return true;
}

absl::StatusOr<QueryOutcome> Scheduler::RunQuery(const QuerySpec& spec, const TokenSink& sink,
                                                 const std::function<bool()>& cancelled,
                                                 Place* place) {
  auto r = std::make_shared<Request>();
  r->spec = &spec;
  if (absl::Status s = impl_->Enqueue(r, TakePlace(place)); !s.ok()) return s;
  if (absl::Status s = impl_->Wait(r, &sink, cancelled); !s.ok()) return s;
  return std::move(r->outcome);
}

absl::Status Scheduler::RunExclusive(const std::function<absl::Status()>& work,
                                     const std::function<bool()>& cancelled, Place* place) {
  return impl_->RunSteps(
      [&work](bool* more) {
        *more = false;
        return work();
      },
      cancelled, TakePlace(place));
}

absl::Status Scheduler::RunExclusiveInSteps(const std::function<absl::Status(bool* more)>& step,
                                            const std::function<bool()>& cancelled) {
  return impl_->RunSteps(step, cancelled, /*placed=*/false);
}

absl::Status Scheduler::CheckRoom() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->RoomLocked();
}

int Scheduler::waiting() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return static_cast<int>(impl_->queue.size());
}

int Scheduler::running() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->running;
}

bool Scheduler::idle() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->queue.empty() && impl_->running == 0;
}

uint64_t Scheduler::admitted() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->admitted;
}

}  // namespace infoflow::server
