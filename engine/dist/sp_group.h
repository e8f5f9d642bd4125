// A sequence-parallel group: N processes (ranks), one per device, joined by
// libtorch's c10d (a TCPStore at HOST:PORT for rendezvous, ProcessGroupGloo
// or, in CUDA builds, ProcessGroupNCCL for the data). engine/dist/ splits one query's context across the ranks
// (docs/DESIGN.md "Sequence parallelism").
//
// Every exchange is point to point (Gloo send/recv), even the collectives,
// so a failure always names the peer it came from: a rank that died or
// stalls makes the operation fail with UNAVAILABLE "rank R: ..." within the
// group's timeout (plus a short wait, below), never hang. The peer a rank
// failed on may have been waiting on the stalled rank itself (a ring), and
// a rank whose wait failed breaks its connections: each rank that fails
// records in the group's store whom it waited on and how, and follows those
// records to the rank that recorded nothing, which its error names
// (BlameChain). After the first
// failure the group is broken:
// every later call fails at once with that error, and the owner must exit
// (or rebuild the group with every rank again).
//
// Ranks must call the same operations in the same order (each call draws the
// next message tags from a counter that every rank advances alike).
// Not thread-safe: one query at a time per group.
#ifndef INFOFLOW_ENGINE_DIST_SP_GROUP_H_
#define INFOFLOW_ENGINE_DIST_SP_GROUP_H_

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace infoflow {

struct GroupOptions {
  std::string host = "127.0.0.1";  // rank 0's address (it hosts the TCPStore)
  int port = 0;                    // rank 0: 0 = an ephemeral port (see on_store_ready)
  int rank = 0;
  int world_size = 1;
  // Rendezvous and every exchange fail after this long without progress.
  std::chrono::milliseconds timeout{30000};
  // Rank 0 only: called with the store's bound port before waiting for the
  // other ranks (how a launcher learns an ephemeral port).
  std::function<void(int port)> on_store_ready;
  // true: a store already serves at host:port (rank 0's GroupStore, which
  // outlives the group); every rank, rank 0 too, connects to it as a client
  // and keeps its rendezvous keys under `key_prefix`, so a server can build
  // a new group (a new prefix) after a rank failed without a new store.
  bool use_existing_store = false;
  std::string key_prefix;
  // The data plane: "gloo" (CPU; any tensor is staged through host memory)
  // or "nccl" (CUDA builds, -DINFOFLOW_CUDA=ON against a libtorch with NCCL:
  // tensors go device to device; CPU tensors are staged on `device`).
  // A build without NCCL refuses "nccl" with UNIMPLEMENTED.
  std::string backend = "gloo";
  // This rank's device for "nccl" (e.g. "cuda:1"; one GPU per rank).
  std::string device = "cpu";
  // Network interface for Gloo's connections (e.g. "eth0"); "" = `host`'s
  // address when it is loopback (one machine), else the address this
  // machine's hostname resolves to.
  std::string interface;
};

// One posted exchange (sends and receives); SequenceParallelGroup::Wait
// finishes it.
class PendingExchange {
 public:
  PendingExchange();
  ~PendingExchange();

 private:
  friend class SequenceParallelGroup;
  struct State;
  std::unique_ptr<State> state_;
};

// Whether this build can use backend "nccl" (a CUDA libtorch with NCCL).
bool DistHasNccl();

class SequenceParallelGroup {
 public:
  // Joins the group: blocks until all world_size ranks have joined or the
  // timeout passes (UNAVAILABLE). InvalidArgument for a bad rank/world size.
  static absl::StatusOr<std::unique_ptr<SequenceParallelGroup>> Join(const GroupOptions& options);
  ~SequenceParallelGroup();

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  int port() const { return port_; }
  int next() const { return (rank() + 1) % world_size(); }
  int prev() const { return (rank() + world_size() - 1) % world_size(); }
  bool broken() const { return !error_.ok(); }

  // Ring step: posts `send` (contiguous) to next() and receives into `recv`
  // (contiguous, preallocated with the size both sides know) from prev().
  // Undefined or empty tensors are skipped (the peer must skip them too).
  // Returns the handle to wait on, so the caller can compute meanwhile.
  std::unique_ptr<PendingExchange> StartRingExchange(const std::vector<at::Tensor>& send,
                                                     const std::vector<at::Tensor>& recv);
  absl::Status Wait(std::unique_ptr<PendingExchange> exchange);

  // Point to point: message i of `sends` on one rank pairs with message i
  // of `recvs` on its peer (both sides build equally long lists; entries
  // with an undefined or empty tensor are skipped and must be skipped on
  // both sides). Blocks until every message has gone and arrived.
  absl::Status Exchange(const std::vector<std::pair<int, at::Tensor>>& sends,
                        const std::vector<std::pair<int, at::Tensor>>& recvs);

  // `t` (contiguous; same shape on every rank) gets root's value.
  absl::Status Broadcast(at::Tensor* t, int root);
  // Every rank's `local` (contiguous; dim 0 of rank r's is rows[r], the
  // other dims equal everywhere) in rank order, on every rank.
  absl::StatusOr<std::vector<at::Tensor>> AllGather(const at::Tensor& local,
                                                    const std::vector<int64_t>& rows);
  // Rank `root` receives every rank's `local` (as AllGather, but one way).
  absl::StatusOr<std::vector<at::Tensor>> Gather(const at::Tensor& local,
                                                 const std::vector<int64_t>& rows, int root);

  // Payload bytes this rank has sent since it joined (or the last reset).
  int64_t bytes_sent() const { return bytes_sent_; }
  void reset_bytes_sent() { bytes_sent_ = 0; }

  SequenceParallelGroup(const SequenceParallelGroup&) = delete;
  SequenceParallelGroup& operator=(const SequenceParallelGroup&) = delete;

 private:
  struct Impl;
  SequenceParallelGroup(GroupOptions options, std::unique_ptr<Impl> impl, int port);
  friend class PendingExchange;

  // The error for a failed wait on `peer` (`what` says how it failed).
  // Records `peer` (and whether this rank timed out on it or lost the
  // connection) as this rank's blame in the store, then follows the other
  // ranks' records (each waited for up to half the group timeout, at most
  // 2 s) to the rank that recorded none, and names it.
  absl::Status BlameChain(int peer, bool timed_out, const std::string& what);

  // Posts sends to / receives from the given peers and returns the handle.
  std::unique_ptr<PendingExchange> Start(const std::vector<std::pair<int, at::Tensor>>& sends,
                                         const std::vector<std::pair<int, at::Tensor>>& recvs);

  GroupOptions options_;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  uint32_t tag_ = 0;
  int64_t bytes_sent_ = 0;
  absl::Status error_;
};

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_DIST_SP_GROUP_H_
