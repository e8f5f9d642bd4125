// GroupLeader: rank 0 of a sequence-parallel server group (docs/DESIGN.md
// §16, "Server group mode"). It hosts the control store at --dist-init,
// forms the group (every rank marks itself ready for the current
// generation; rank 0 then says go and all build the Gloo group together),
// watches the other ranks' heartbeats while idle, and runs each query over
// the group: it publishes the query as a GroupCommand, shares the chunk
// records the other ranks lack (ShareChunks) and runs RunShardedQuery as
// rank 0, streaming the tokens it decodes.
//
// When a rank fails (an exchange fails or times out mid-query, or its
// heartbeat stops while idle) the query in flight fails with UNAVAILABLE
// naming the rank, the group becomes "incomplete" (Health NOT_SERVING,
// queries refused with UNAVAILABLE at once) and rank 0 starts the next
// generation: the surviving ranks rejoin by themselves, a restarted rank
// joins when it comes back, and the group serves again (Health SERVING).
// Rank 0 never exits for a peer's failure.
//
// Thread-safe. RunQuery runs one query at a time (the group is one
// device); the server calls it from its scheduler's prefill thread.
#ifndef INFOFLOW_SERVER_GROUP_GROUP_LEADER_H_
#define INFOFLOW_SERVER_GROUP_GROUP_LEADER_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/dist/group_store.h"
#include "engine/dist/sp_group.h"
#include "server/group/group_config.h"
#include "server/query_runner.h"

namespace infoflow {
class Model;
class Tokenizer;
namespace store {
class ChunkStore;
}
}  // namespace infoflow

namespace infoflow::server {

class GroupLeader {
 public:
  // Binds the control store at config.host:config.port and starts forming
  // the group in the background. Pointers must outlive the leader.
  // `on_serving(true|false)` is called (from any thread) whenever the group
  // becomes complete or breaks; use SetServingCallback.
  static absl::StatusOr<std::unique_ptr<GroupLeader>> Start(const GroupConfig& config,
                                                            const Model* model,
                                                            const Tokenizer* tokenizer,
                                                            store::ChunkStore* store);
  ~GroupLeader();
  GroupLeader(const GroupLeader&) = delete;
  GroupLeader& operator=(const GroupLeader&) = delete;

  // Calls `cb(ready())` at once, then on every change.
  void SetServingCallback(std::function<void(bool serving)> cb);
  bool ready() const;
  int port() const;  // the control store's bound port

  // The query over the group, as QueryRunner::Run over one process: the
  // same checks and chunk resolution (runner.ResolveInput), then the
  // sequence-parallel pipeline. Before any work: InvalidArgument for a
  // method or option the group cannot run (naming `method` / `reorder`),
  // UNAVAILABLE while the group is incomplete. UNAVAILABLE naming the rank
  // when one fails mid-query.
  absl::StatusOr<QueryOutcome> RunQuery(const QueryRunner& runner, const QuerySpec& spec,
                                        const TokenSink& sink);

  // Queries run over the group and failures seen, since start.
  uint64_t queries() const { return queries_.load(); }
  uint64_t failures() const { return failures_.load(); }
  int64_t generation() const;

 private:
  GroupLeader(const GroupConfig& config, const Model* model, const Tokenizer* tokenizer,
              store::ChunkStore* store, std::unique_ptr<GroupStore> control);
  void Monitor();
  // Starts the next generation (the current group is dropped). mu_ held.
  void BreakLocked(const std::string& why);
  void NotifyLocked();
  // What an incomplete group waits for ("waiting for rank 1, 2 (generation
  // 3)"). mu_ held.
  std::string WaitingForLocked() const;
  // Forms generation `gen`: waits for every ready mark, says go, joins.
  void Form(int64_t gen);

  const GroupConfig config_;
  const Model* model_;
  const Tokenizer* tokenizer_;
  store::ChunkStore* store_;
  std::unique_ptr<GroupStore> control_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool ready_ = false;
  bool in_flight_ = false;
  int64_t generation_ = 0;
  int64_t seq_ = 0;
  std::unique_ptr<SequenceParallelGroup> group_;
  std::vector<int> missing_;  // ranks not ready for the current generation
  // Heartbeats: each rank's last counter and when it last moved.
  std::vector<int64_t> beat_;
  std::vector<std::chrono::steady_clock::time_point> beat_at_;
  std::function<void(bool)> on_serving_;
  std::atomic<uint64_t> queries_{0}, failures_{0};
  std::thread monitor_;
};

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_GROUP_GROUP_LEADER_H_
