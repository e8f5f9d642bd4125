// GroupWorker: a rank > 0 of a sequence-parallel server group (docs/DESIGN.md
// §16, "Server group mode"). It connects to rank 0's control store, marks
// itself ready for the current generation, joins the Gloo group when rank 0
// says go, and then serves rank 0's commands one by one: fetch its own
// chunks (ShareChunks), run its part of RunShardedQuery. A heartbeat thread
// adds to the rank's counter in the store, so rank 0 notices a dead or
// stopped rank while the group is idle.
//
// It never gives up: when an exchange fails or rank 0 starts a new
// generation it rejoins, and when rank 0 itself is gone it reconnects until
// rank 0 is back. `on_serving` says whether it is in a complete group
// (its Health). Stop() ends it.
#ifndef INFOFLOW_SERVER_GROUP_GROUP_WORKER_H_
#define INFOFLOW_SERVER_GROUP_GROUP_WORKER_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "engine/dist/group_store.h"
#include "engine/dist/sp_group.h"
#include "server/group/group_command.h"
#include "server/group/group_config.h"

namespace infoflow {
class Model;
class Tokenizer;
namespace store {
class ChunkStore;
}
}  // namespace infoflow

namespace infoflow::server {

class GroupWorker {
 public:
  // Starts the worker's thread. Pointers must outlive the worker.
  GroupWorker(const GroupConfig& config, const Model* model, const Tokenizer* tokenizer,
              store::ChunkStore* store, std::function<void(bool serving)> on_serving);
  ~GroupWorker();  // Stop()
  GroupWorker(const GroupWorker&) = delete;
  GroupWorker& operator=(const GroupWorker&) = delete;

  void Stop();
  bool serving() const { return serving_.load(); }
  uint64_t queries() const { return queries_.load(); }

 private:
  void Run();
  // One connection to rank 0's store: join, serve, rejoin. Returns when the
  // store fails (rank 0 gone) or Stop().
  absl::Status Serve(GroupStore* control);
  absl::Status RunCommand(SequenceParallelGroup* group, const GroupCommand& cmd);
  void Heartbeats();
  void SetServing(bool s);
  bool Sleep(std::chrono::milliseconds d);  // false when stopping

  const GroupConfig config_;
  const Model* model_;
  const Tokenizer* tokenizer_;
  store::ChunkStore* store_;
  std::function<void(bool)> on_serving_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::shared_ptr<GroupStore> control_;  // the heartbeat thread's view of it
  std::atomic<bool> serving_{false};
  std::atomic<uint64_t> queries_{0};
  std::thread thread_, heartbeat_;
};

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_GROUP_GROUP_WORKER_H_
