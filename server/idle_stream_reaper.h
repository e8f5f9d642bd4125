// IdleStreamReaper: ends client streams that have sent nothing for too long.
#ifndef INFOFLOW_SERVER_IDLE_STREAM_REAPER_H_
#define INFOFLOW_SERVER_IDLE_STREAM_REAPER_H_

#include <grpcpp/server_context.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <mutex>
#include <thread>

namespace infoflow::server {

// A synchronous gRPC handler of a client stream holds one server thread
// while it waits in Read(). Without a bound, idle streams (3000 of them took
// 3000 threads) exhaust --grpc-max-threads, and every later call is refused.
// The reaper cancels (ServerContext::TryCancel) a watched stream whose client
// has sent nothing for `idle`; time the handler spends working between two
// reads does not count. Thread-safe.
class IdleStreamReaper {
 public:
  // `idle` <= 0: never reaps (Watch still works).
  explicit IdleStreamReaper(std::chrono::milliseconds idle);
  ~IdleStreamReaper();  // joins its thread; every Watch must have ended
  IdleStreamReaper(const IdleStreamReaper&) = delete;
  IdleStreamReaper& operator=(const IdleStreamReaper&) = delete;

  struct Entry;
  // Watches one stream for its handler's lifetime (create it in the handler,
  // before the first Read). Starts as waiting for the client.
  class Watch {
   public:
    Watch(IdleStreamReaper* reaper, grpc::ServerContext* ctx);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
    // The handler got a message and works on it: not idle until Waiting().
    void Working();
    // The handler waits for the client's next message, from now.
    void Waiting();
    // True once the reaper cancelled the stream for idling.
    bool reaped() const;

   private:
    IdleStreamReaper* reaper_;
    std::list<Entry>::iterator entry_;
  };

  int64_t reaped_total() const;

 private:
  void Run();

  const std::chrono::milliseconds idle_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<Entry> entries_;
  int64_t reaped_total_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

struct IdleStreamReaper::Entry {
  grpc::ServerContext* ctx;
  bool waiting = true;
  std::chrono::steady_clock::time_point since;
  bool reaped = false;
};

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_IDLE_STREAM_REAPER_H_
