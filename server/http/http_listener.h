// The HTTP listener's connection handling, on cpp-httplib: what the
// library's defaults leave unbounded.
//
// cpp-httplib serves each connection on one pool thread from its first byte
// to its close, and its read timeout applies to each read alone: a client
// that sends a header line every few seconds ("slowloris") keeps its thread
// for as long as it likes, and as many such clients as pool threads stop the
// HTTP API (gRPC is not affected). Measured on 0.11.4 with the 40-thread
// pool this file replaces: 45 connections trickling one header line every
// 4 s, and GET /health got no answer in 25 s.
//
//  - RequestDeadlineServer reads each request (request line, headers, body)
//    under one deadline counted from its first byte, and caps the bytes of
//    its request line and headers (the library caps each header line, not
//    their number). A client past either is answered 400 where the library
//    still can, and its connection is closed.
//  - ElasticThreadPool starts a thread per connection as they arrive, up to
//    a cap, and lets a thread that has been idle for a while exit: the cap
//    can be hundreds without hundreds of idle threads.
//
// Together, one slow client holds one thread for at most the deadline, and
// holding every thread takes cap / deadline new connections per second: a
// flood, which a firewall or proxy in front must stop (docs/DESIGN.md §14).
#ifndef INFOFLOW_SERVER_HTTP_HTTP_LISTENER_H_
#define INFOFLOW_SERVER_HTTP_HTTP_LISTENER_H_

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace infoflow::server::http {

// A cpp-httplib TaskQueue (one task = one connection) that runs each task on
// an idle thread, or on a new one while fewer than `max_threads` exist; past
// that, up to `max_waiting` tasks wait in FIFO order. A task past those runs
// at once on the caller's thread (the library's accept loop) with
// InOverflow() true, so that it refuses its connection quickly: every
// accepted connection holds a descriptor, and an unbounded queue let a flood
// of idle connections take all of them (RocksDB and gRPC need some too). A
// thread idle for `idle_exit` exits. Thread-safe; shutdown() runs the
// waiting tasks, then joins every thread.
class ElasticThreadPool : public httplib::TaskQueue {
 public:
  ElasticThreadPool(size_t max_threads, size_t max_waiting,
                    std::chrono::milliseconds idle_exit = std::chrono::seconds(30));
  ~ElasticThreadPool() override;
  ElasticThreadPool(const ElasticThreadPool&) = delete;
  ElasticThreadPool& operator=(const ElasticThreadPool&) = delete;

  void enqueue(std::function<void()> fn) override;
  void shutdown() override;

  size_t threads() const;  // threads alive now
  size_t waiting() const;  // tasks queued for a thread
  // True while this thread runs a task the pool had no room for.
  static bool InOverflow();

 private:
  void Worker();

  const size_t max_threads_, max_waiting_;
  const std::chrono::milliseconds idle_exit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;     // joined at shutdown; exited ones too
  std::vector<std::thread::id> exited_;  // exited threads not yet joined
  size_t alive_ = 0, idle_ = 0, busy_ = 0;  // threads: started, waiting, running a task
  bool stop_ = false;
};

// Why a connection's request was cut short.
enum class RequestFailure {
  kNone,
  kDeadline,      // not whole within the request timeout
  kHeadTooLarge,  // request line and headers over the byte cap
  kBodyTooLarge,  // body bytes (with chunked framing) over the byte cap
  kBodiesBudget,  // the bodies of all requests in flight over their budget
  kListenerFull,  // every thread busy and the wait queue full: refused at once
};

// What a request may take to arrive (RequestDeadlineServer).
struct RequestLimits {
  std::chrono::milliseconds timeout{30000};  // the whole request, from its first byte
  size_t max_head_bytes = 64 << 10;          // request line and headers
  size_t max_body_bytes = 16 << 20;          // one body as sent (chunked framing counts)
  // Body bytes of all requests being read or handled at once: each
  // connection's body is bounded, but 512 of them at 16 MiB would be 8 GiB.
  size_t max_inflight_body_bytes = 256 << 20;
};

// The metric label of a failure: "deadline", "head_too_large", ...
const char* RequestFailureName(RequestFailure why);

// An httplib::Server whose requests must arrive within RequestLimits: whole
// within `timeout` of the first byte, at most `max_head_bytes` of request
// line and headers and `max_body_bytes` of body as sent, and the bodies in
// flight within `max_inflight_body_bytes` together. The library checks a
// Content-Length against its own payload limit before reading, but reads a
// chunked body of any size into memory (measured: 200 MB, RSS +250 MB). A
// request that breaks a limit gets the library's 400 (the error handler
// restates it from CurrentRequestFailure), and its connection is closed and
// reported to `on_dropped` (may be empty) with the peer's "ip:port". A
// connection the thread pool had no room for (ElasticThreadPool) gets a 503
// with `busy_body` (JSON) and is reported as kListenerFull with no peer.
// Everything else is the library's: routing, keep-alive (at most
// keep_alive_max_count requests, each awaited for keep_alive_timeout), the
// per-read and per-write timeouts. Each request of a keep-alive connection
// gets its own deadline; writing a response is not under it (a slow reader
// is bounded by the write timeout).
class RequestDeadlineServer : public httplib::Server {
 public:
  using DroppedCallback = std::function<void(const std::string& peer, RequestFailure why)>;
  RequestDeadlineServer(const RequestLimits& limits, const std::string& busy_body,
                        DroppedCallback on_dropped);

  // Whether the client of the request this thread is handling has closed
  // its connection (false outside a handler of this server). A handler that
  // answers in one piece polls it to stop work that nobody will read; a
  // streamed answer finds out when its next write fails.
  static bool ClientGone();
  // Why reading the request this thread is handling was cut short (kNone
  // outside a handler of this server): for the error handler's answer.
  static RequestFailure CurrentRequestFailure();

  // Call after bind_to_port / bind_to_any_port: re-listens the bound socket
  // with room for `backlog` connections not yet accepted (the kernel caps it
  // at net.core.somaxconn). The library listens with a backlog of 5, and a
  // burst of connections past that is refused or, worse, left to TCP's
  // retransmission backoff: measured, 64 /health requests at once had p90
  // 1-2.7 s and a max of 4.4 s, and 200 got connection resets (pinned by
  // tests/http/http_test.cc ABurstOfConnectionsIsServed). False if not
  // bound or listen fails.
  bool WidenListenBacklog(int backlog);

 private:
  // The library's hook for how a connection is served (its SSLServer
  // overrides it too); ours serves it through a stream with the deadline.
  bool process_and_close_socket(socket_t sock) override;

  const RequestLimits limits_;
  const std::string busy_response_;  // the whole 503, status line to body
  std::atomic<size_t> inflight_body_bytes_{0};
  const DroppedCallback on_dropped_;
};

}  // namespace infoflow::server::http

#endif  // INFOFLOW_SERVER_HTTP_HTTP_LISTENER_H_
