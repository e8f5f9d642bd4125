// IdleStreamReaper: ends client streams that have sent nothing for too long.
#ifndef INFOFLOW_SERVER_IDLE_STREAM_REAPER_H_
#define INFOFLOW_SERVER_IDLE_STREAM_REAPER_H_

#include <grpcpp/server_context.h>

#include <chrono>
#include <condition_variable>
#include <list>
#include <mutex>
#include <thread>

namespace infoflow::server {

// A synchronous gRPC handler holds one server thread while it waits on its
// client: in Read() for the next message of a client stream, or in Write()
// when the client reads nothing and the stream's flow-control window is full.
// Without a bound, such streams (3000 idle ones took 3000 threads) exhaust
// --grpc-max-threads, and every later call is refused. The reaper cancels
// (ServerContext::TryCancel) a watched stream that has waited on its client
// for `idle` at a stretch; time the handler spends working does not count.
// Thread-safe.
class IdleStreamReaper {
 public:
  // `idle` <= 0: never reaps (Watch still works).
  explicit IdleStreamReaper(std::chrono::milliseconds idle);
  ~IdleStreamReaper();  // joins its thread; every Watch must have ended
  IdleStreamReaper(const IdleStreamReaper&) = delete;
  IdleStreamReaper& operator=(const IdleStreamReaper&) = delete;

 private:
  struct Entry {  // one watched stream; guarded by mu_
    grpc::ServerContext* ctx;
    bool waiting;  // on its client, since `since`
    std::chrono::steady_clock::time_point since;
    bool reaped = false;
  };

 public:
  // Watches one stream for its handler's lifetime (create it in the handler,
  // before the first Read or Write). Starts waiting on the client, or
  // working when `waiting` is false.
  class Watch {
   public:
    Watch(IdleStreamReaper* reaper, grpc::ServerContext* ctx, bool waiting = true);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
    // The handler works (on a message, or while its query is computed): not
    // idle until Waiting().
    void Working();
    // The handler waits on the client from now: in Read(), or in Write().
    void Waiting();
    // True once the reaper cancelled the stream for idling.
    bool reaped() const;

   private:
    IdleStreamReaper* reaper_;
    std::list<Entry>::iterator entry_;
  };

 private:
  void Run();

  const std::chrono::milliseconds idle_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::list<Entry> entries_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_IDLE_STREAM_REAPER_H_
