// Scheduler: the one engine loop of the server's device (docs/DESIGN.md,
// "Serving: one scheduler per device").
//
// Requests (queries and ingest batches) enter one FIFO queue. Two threads
// share the device, and exactly one of them computes at any time (a "device
// baton"), so the device's threads are never oversubscribed:
//  - the prefill thread takes requests in FIFO order, one at a time, and runs
//    their prefill-side work (chunk fetch, reposition, scoring, recompute,
//    prompt prefill; or an ingest batch) under a yield policy
//    (engine/model/yield_point.h): between pieces of at most
//    `max_batch_tokens` query rows it hands the device to the decode loop
//    for one step when any request is decoding and the prefill has used its
//    `prefill_slice_ms` since it last took the device, then continues. A
//    prefill that starts while nothing decodes runs whole, without yield
//    points or row blocks: nothing can start decoding before it ends (only
//    this thread moves requests into the batch), so it runs at the engine's
//    in-process speed;
//  - the decode loop advances every query in its decode phase by one token
//    per step with one batched forward (Model::DecodeStep). Queries join
//    after their prefill and leave when they finish, are cancelled or pass
//    their deadline; their KV cache is freed at once.
// Admission: at most `max_running` requests past the queue (prefilling or
// decoding), at most `queue_depth` more waiting (past that:
// RESOURCE_EXHAUSTED at once), and the KV bytes of running queries within
// `max_kv_bytes` (a query that would exceed it waits, in FIFO order; one that
// could never fit is refused with OUT_OF_RANGE naming --max-kv-bytes).
//
// Thread-safe: every public method may be called from any gRPC thread.
#ifndef INFOFLOW_SERVER_SCHEDULER_H_
#define INFOFLOW_SERVER_SCHEDULER_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/query_runner.h"

namespace infoflow {
class Model;
}

namespace infoflow::server {

class Metrics;

struct SchedulerOptions {
  int max_running = 16;    // requests prefilling or decoding at once
  int queue_depth = 16;    // requests waiting beyond that
  int64_t max_kv_bytes = int64_t{4} << 30;  // KV cache bytes of running queries
  int64_t max_batch_tokens = 512;           // query rows per piece of prefill work
  // A prefill keeps the device at least this long before a waiting decode
  // step gets it (at the next yield point); 0 = hand over at every yield
  // point. Bounds decode stalls to about this plus one step.
  double prefill_slice_ms = 20;
};

class Scheduler {
  struct Impl;

 public:
  // `model`, `runner` and `metrics` (may be null) must outlive the
  // scheduler. Starts the prefill thread and the decode loop.
  Scheduler(const Model* model, const QueryRunner* runner, Metrics* metrics,
            const SchedulerOptions& options);
  // Stops both threads; requests still queued fail with UNAVAILABLE.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // A place in the queue taken ahead of the request that will use it, for a
  // caller that must learn "busy" before it commits to a reply that can no
  // longer carry a status (an HTTP stream, once its 200 is sent). While held
  // it counts against --queue-depth as a waiting request does; RunQuery or
  // RunExclusive given it enqueues without a room check, and destroying an
  // unused one gives the place back. Move-only; must not outlive the
  // Scheduler.
  class Place {
   public:
    Place() = default;
    Place(Place&& other) noexcept : impl_(other.impl_) { other.impl_ = nullptr; }
    Place& operator=(Place&& other) noexcept;
    ~Place() { GiveBack(); }
    bool held() const { return impl_ != nullptr; }

   private:
    friend class Scheduler;
    explicit Place(Impl* impl) : impl_(impl) {}
    void GiveBack();
    Impl* impl_ = nullptr;
  };

  // Takes a place: what RunQuery would answer now for want of room
  // (RESOURCE_EXHAUSTED: queue full; UNAVAILABLE: shutting down), else a
  // held Place.
  absl::StatusOr<Place> ReservePlace();

  // Runs a Prepare'd query to completion, calling `sink` on the caller's
  // thread for each token (return false to cancel). `cancelled` is polled
  // while waiting (client gone or deadline passed): a queued query then
  // leaves the queue (CANCELLED), a running one stops at the next step and
  // frees its cache. Errors: RESOURCE_EXHAUSTED (queue full; never with a
  // held `place`, which this call uses up), OUT_OF_RANGE (KV larger than
  // --max-kv-bytes), UNAVAILABLE (shutting down), and QueryRunner::Prefill's.
  absl::StatusOr<QueryOutcome> RunQuery(const QuerySpec& spec, const TokenSink& sink,
                                        const std::function<bool()>& cancelled,
                                        Place* place = nullptr);

  // Runs `work` on the prefill thread, in FIFO order with the queries'
  // prefills and under the same yield policy. Blocks until done.
  // RESOURCE_EXHAUSTED when the queue is full (never with a held `place`,
  // used up as by RunQuery), CANCELLED when `cancelled()` turned true while
  // queued.
  absl::Status RunExclusive(const std::function<absl::Status()>& work,
                            const std::function<bool()>& cancelled, Place* place = nullptr);

  // As RunExclusive, for work that comes in steps (an ingest batch, a chunk
  // a step): `step` runs once per turn and sets *more while work is left;
  // the request then goes to the back of the queue, so what arrived
  // meanwhile (a query's prefill) runs before its next step, and a query
  // waits for one step, not for the whole batch. Admission (--queue-depth)
  // applies once, at the start. An error or !*more ends it.
  absl::Status RunExclusiveInSteps(const std::function<absl::Status(bool* more)>& step,
                                   const std::function<bool()>& cancelled);

  // What RunQuery or RunExclusive would answer now for want of room:
  // RESOURCE_EXHAUSTED (queue full) or UNAVAILABLE (shutting down), else OK.
  // Advisory: lets a caller refuse before costly preparation (tokenizing an
  // ingest batch); the queue may still fill before it enqueues.
  absl::Status CheckRoom() const;

  int waiting() const;  // requests in the queue
  int running() const;  // requests past the queue (prefilling or decoding)
  // No request runs or waits.
  bool idle() const;
  // Requests taken from the queue since construction.
  uint64_t admitted() const;

 private:
  // Whether `place` holds a place in this scheduler's queue; if so it is
  // used up (still counted until Enqueue queues the request under the lock).
  bool TakePlace(Place* place);
  std::unique_ptr<Impl> impl_;
};

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_SCHEDULER_H_
