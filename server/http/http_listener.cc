#include "server/http/http_listener.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

namespace infoflow::server::http {

// ------------------------------------------------------------ thread pool

namespace {
thread_local bool in_overflow = false;  // ElasticThreadPool::InOverflow
}  // namespace

ElasticThreadPool::ElasticThreadPool(size_t max_threads, size_t max_waiting,
                                     std::chrono::milliseconds idle_exit)
    : max_threads_(std::max<size_t>(1, max_threads)),
      max_waiting_(max_waiting),
      idle_exit_(idle_exit) {}

bool ElasticThreadPool::InOverflow() { return in_overflow; }

ElasticThreadPool::~ElasticThreadPool() { shutdown(); }

void ElasticThreadPool::enqueue(std::function<void()> fn) {
  std::vector<std::thread> done;
  {
    std::unique_lock<std::mutex> l(mu_);
    if (stop_) {
      // Not expected (the library stops accepting first), but a connection
      // must still be closed: its task sees the listener gone and does so.
      l.unlock();
      fn();
      return;
    }
    // Threads that exited while idle: join them here, off the workers.
    for (std::thread::id id : exited_) {
      auto it = std::find_if(threads_.begin(), threads_.end(),
                             [&](const std::thread& t) { return t.get_id() == id; });
      if (it != threads_.end()) {
        done.push_back(std::move(*it));
        threads_.erase(it);
      }
    }
    exited_.clear();
    // Tasks queued now will run on the threads not busy (alive or yet to be
    // started) or wait; past that there is no room.
    if (tasks_.size() >= (max_threads_ - busy_) + max_waiting_) {
      l.unlock();
      in_overflow = true;
      fn();
      in_overflow = false;
      for (std::thread& t : done) t.join();
      return;
    }
    tasks_.push_back(std::move(fn));
    // More tasks than threads waiting for one: start a thread, if allowed.
    if (tasks_.size() > idle_ && alive_ < max_threads_) {
      ++alive_;
      threads_.emplace_back([this] { Worker(); });
    }
  }
  cv_.notify_one();
  for (std::thread& t : done) t.join();
}

void ElasticThreadPool::shutdown() {
  std::vector<std::thread> all;
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    all.swap(threads_);
    exited_.clear();
  }
  cv_.notify_all();
  for (std::thread& t : all) t.join();
}

size_t ElasticThreadPool::threads() const {
  std::lock_guard<std::mutex> l(mu_);
  return alive_;
}

size_t ElasticThreadPool::waiting() const {
  std::lock_guard<std::mutex> l(mu_);
  return tasks_.size();
}

void ElasticThreadPool::Worker() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    ++idle_;
    const bool woke = cv_.wait_for(l, idle_exit_, [&] { return stop_ || !tasks_.empty(); });
    --idle_;
    if (!tasks_.empty()) {  // queued tasks run even after shutdown() began
      std::function<void()> fn = std::move(tasks_.front());
      tasks_.pop_front();
      ++busy_;
      l.unlock();
      fn();
      l.lock();
      --busy_;
      continue;
    }
    if (stop_ || !woke) {
      --alive_;
      if (!stop_) exited_.push_back(std::this_thread::get_id());
      return;
    }
  }
}

// ------------------------------------------------------------ the server

namespace {

using Clock = std::chrono::steady_clock;

// poll() on one descriptor, retried on EINTR; the timeout in ms (0 = now).
int PollOne(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  while (true) {
    const int r = ::poll(&p, 1, timeout_ms);
    if (r >= 0 || errno != EINTR) return r;
  }
}

void AddressOf(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  const int r = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                     : ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  if (r != 0) return;
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof(buf));
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof(buf));
    port = ntohs(v6->sin6_port);
  }
  ip = buf;
}

// One connection's socket as an httplib::Stream. Reads are buffered (the
// library reads a request's line and headers a byte at a time) and held to
// the RequestLimits: each waits at most the per-read timeout and never past
// the request's deadline, and the bytes handed over are counted against the
// head and body caps and the server's shared body budget. Once a limit is
// broken every read fails, so the library gives up on the request. Waits
// are sliced so a stopping server is noticed within kSliceMs.
class DeadlineSocketStream final : public httplib::Stream {
 public:
  static constexpr int kSliceMs = 200;

  DeadlineSocketStream(int sock, std::chrono::milliseconds read_timeout,
                       std::chrono::milliseconds write_timeout, const RequestLimits* limits,
                       std::atomic<size_t>* inflight_body_bytes,
                       const std::atomic<socket_t>* listening)
      : sock_(sock),
        read_timeout_(read_timeout),
        write_timeout_(write_timeout),
        limits_(limits),
        inflight_body_bytes_(inflight_body_bytes),
        listening_(listening) {}
  ~DeadlineSocketStream() override { EndRequest(); }

  // Waits up to `timeout` for the next request's first byte; false when
  // none came, the peer closed, or the server is stopping.
  bool AwaitRequest(std::chrono::milliseconds timeout) {
    if (off_ < len_) return true;
    return Wait(POLLIN, Clock::now() + timeout);
  }
  // A request starts now, under the limits.
  void StartRequest() {
    EndRequest();
    deadline_ = Clock::now() + limits_->timeout;
    failure_ = RequestFailure::kNone;
    head_bytes_ = 0;
    head_tail_ = 0;
    head_done_ = false;
  }
  // The request has been handled: its body's bytes leave the budget.
  void EndRequest() {
    inflight_body_bytes_->fetch_sub(body_bytes_);
    body_bytes_ = 0;
  }
  // Why reading the request was cut short, if it was.
  RequestFailure failure() const { return failure_; }

  bool is_readable() const override { return off_ < len_ || WaitToRead(); }
  bool is_writable() const override {
    return Wait(POLLOUT, Clock::now() + write_timeout_) && PeerOpen();
  }
  ssize_t read(char* ptr, size_t size) override {
    if (failure_ != RequestFailure::kNone) return -1;
    ssize_t got;
    if (off_ < len_) {
      const size_t k = std::min(size, len_ - off_);
      std::memcpy(ptr, buf_ + off_, k);
      off_ += k;
      got = static_cast<ssize_t>(k);
    } else if (!WaitToRead()) {
      return -1;
    } else if (size >= sizeof(buf_)) {
      got = Recv(ptr, size);  // a large read (a body) goes straight to the caller
    } else {
      const ssize_t n = Recv(buf_, sizeof(buf_));
      if (n <= 0) return n;
      off_ = 0;
      len_ = static_cast<size_t>(n);
      return read(ptr, size);
    }
    if (got > 0 && !CountRequestBytes(ptr, static_cast<size_t>(got))) return -1;
    return got;
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    while (true) {
      const ssize_t n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
      if (n >= 0 || errno != EINTR) return n;
    }
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    AddressOf(sock_, /*peer=*/true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    AddressOf(sock_, /*peer=*/false, ip, port);
  }
  socket_t socket() const override { return sock_; }

  // Whether the peer has not closed (what the library asks before each
  // streamed write, so a client that went away cancels its query).
  bool PeerOpen() const {
    if (PollOne(sock_, POLLIN, 0) <= 0) return true;
    char c;
    const ssize_t n = ::recv(sock_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
  }

 private:
  // Counts bytes handed to the library: the head's until it ends (a line
  // that is only CRLF, so the bytes "\n\r\n"), the body's after; false once
  // either is over its cap. The library keeps every header line (each up to
  // 8 KiB) with no limit on their number: without this a client streamed
  // 136 MB of headers in 8 s and the server's RSS grew by 190 MB, all
  // within the deadline.
  bool CountRequestBytes(const char* p, size_t n) {
    size_t i = 0;
    for (; i < n && !head_done_; ++i) {
      head_tail_ = ((head_tail_ << 8) | static_cast<unsigned char>(p[i])) & 0xFFFFFF;
      ++head_bytes_;
      head_done_ = head_tail_ == 0x0A0D0A;  // "\n\r\n"
    }
    if (!head_done_) {
      if (head_bytes_ <= limits_->max_head_bytes) return true;
      failure_ = RequestFailure::kHeadTooLarge;
      return false;
    }
    // Body bytes count only once handed over: a failed read hands none.
    const size_t body = n - i;
    if (body == 0) return true;
    if (body_bytes_ + body > limits_->max_body_bytes) {
      failure_ = RequestFailure::kBodyTooLarge;
      return false;
    }
    if (inflight_body_bytes_->fetch_add(body) + body > limits_->max_inflight_body_bytes) {
      inflight_body_bytes_->fetch_sub(body);
      failure_ = RequestFailure::kBodiesBudget;
      return false;
    }
    body_bytes_ += body;
    return true;
  }
  // Waits for input within both the per-read timeout and the deadline.
  bool WaitToRead() const {
    const Clock::time_point now = Clock::now();
    if (now >= deadline_) {
      failure_ = RequestFailure::kDeadline;
      return false;
    }
    const bool deadline_first = deadline_ <= now + read_timeout_;
    if (Wait(POLLIN, deadline_first ? deadline_ : now + read_timeout_)) return true;
    // Nothing came in time; the deadline's fault unless the server stopped.
    if (deadline_first && listening_->load() != INVALID_SOCKET) {
      failure_ = RequestFailure::kDeadline;
    }
    return false;
  }
  // Polls for `events` until `until`, in slices, while the server listens.
  bool Wait(short events, Clock::time_point until) const {
    while (listening_->load() != INVALID_SOCKET) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
      if (left <= 0) return PollOne(sock_, events, 0) > 0;
      const int r = PollOne(sock_, events, static_cast<int>(std::min<int64_t>(left, kSliceMs)));
      if (r != 0) return r > 0;
    }
    return false;
  }
  ssize_t Recv(char* ptr, size_t size) {
    while (true) {
      const ssize_t n = ::recv(sock_, ptr, size, 0);
      if (n >= 0 || errno != EINTR) return n;
    }
  }

  const int sock_;
  const std::chrono::milliseconds read_timeout_, write_timeout_;
  const RequestLimits* limits_;
  std::atomic<size_t>* inflight_body_bytes_;  // the server's, over all connections
  const std::atomic<socket_t>* listening_;
  Clock::time_point deadline_ = Clock::time_point::max();
  size_t head_bytes_ = 0, body_bytes_ = 0;
  uint32_t head_tail_ = 0;  // the last three bytes of the head read so far
  bool head_done_ = false;
  // Set by a read, which the library may make through the const is_readable.
  mutable RequestFailure failure_ = RequestFailure::kNone;
  char buf_[4096];
  size_t off_ = 0, len_ = 0;
};

// The connection whose request this thread is handling (ClientGone).
thread_local const DeadlineSocketStream* current_connection = nullptr;

// Closes a connection whose request was cut short so that the client can
// read the error answer: closing a socket with unread input sends a reset,
// which over a real network can overtake the answer and make the client's
// kernel drop it (RFC 9112 §9.6). So: end our side, read and drop what the
// client still sends, for at most 2 s and 1 MiB, then close (Apache's
// "lingering close"). On loopback the tests pass either way.
void LingeringClose(int sock) {
  ::shutdown(sock, SHUT_WR);
  const Clock::time_point until = Clock::now() + std::chrono::seconds(2);
  char scratch[16384];
  for (size_t drained = 0; drained < (1 << 20);) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0 || PollOne(sock, POLLIN, static_cast<int>(left)) <= 0) break;
    const ssize_t n = ::recv(sock, scratch, sizeof(scratch), MSG_DONTWAIT);
    if (n <= 0 && !(n < 0 && (errno == EINTR || errno == EAGAIN))) break;
    if (n > 0) drained += static_cast<size_t>(n);
  }
  ::close(sock);
}

std::chrono::milliseconds Ms(time_t sec, time_t usec) {
  return std::chrono::milliseconds(sec * 1000 + usec / 1000);
}

}  // namespace

RequestDeadlineServer::RequestDeadlineServer(const RequestLimits& limits,
                                             const std::string& busy_body,
                                             DroppedCallback on_dropped)
    : limits_(limits),
      busy_response_(
          "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
          "Connection: close\r\nRetry-After: 1\r\nContent-Length: " +
          std::to_string(busy_body.size()) + "\r\n\r\n" + busy_body),
      on_dropped_(std::move(on_dropped)) {}

const char* RequestFailureName(RequestFailure why) {
  switch (why) {
    case RequestFailure::kNone:
      return "none";
    case RequestFailure::kDeadline:
      return "deadline";
    case RequestFailure::kHeadTooLarge:
      return "head_too_large";
    case RequestFailure::kBodyTooLarge:
      return "body_too_large";
    case RequestFailure::kBodiesBudget:
      return "bodies_budget";
    case RequestFailure::kListenerFull:
      return "listener_full";
  }
  return "none";
}

bool RequestDeadlineServer::WidenListenBacklog(int backlog) {
  const socket_t sock = svr_sock_.load();
  return sock != INVALID_SOCKET && ::listen(sock, backlog) == 0;
}

bool RequestDeadlineServer::ClientGone() {
  return current_connection != nullptr && !current_connection->PeerOpen();
}

RequestFailure RequestDeadlineServer::CurrentRequestFailure() {
  return current_connection != nullptr ? current_connection->failure() : RequestFailure::kNone;
}

// The library's own loop (detail::process_server_socket), with our stream.
bool RequestDeadlineServer::process_and_close_socket(socket_t sock) {
  if (ElasticThreadPool::InOverflow()) {
    // No thread and no room to wait: say so without reading (this runs on
    // the accept loop, and a fresh socket's buffer takes this at once).
    (void)::send(sock, busy_response_.data(), busy_response_.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    ::close(sock);
    if (on_dropped_) on_dropped_("", RequestFailure::kListenerFull);
    return false;
  }
  // An answer streams as small writes (an SSE event a token). With Nagle on,
  // each waits for the client to acknowledge the one before, and clients
  // delay that acknowledgement (up to 40 ms on Linux, 200 ms on Windows),
  // so tokens would arrive in bursts at that pace. As nginx, Go's net/http
  // and Node's http do for such traffic, write each at once.
  const int one = 1;
  (void)::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  DeadlineSocketStream strm(sock, Ms(read_timeout_sec_, read_timeout_usec_),
                            Ms(write_timeout_sec_, write_timeout_usec_), &limits_,
                            &inflight_body_bytes_, &svr_sock_);
  bool ok = false, cut_short = false;
  for (size_t left = keep_alive_max_count_; left > 0; --left) {
    if (!strm.AwaitRequest(std::chrono::seconds(keep_alive_timeout_sec_))) break;
    strm.StartRequest();
    bool connection_closed = false;
    current_connection = &strm;
    ok = process_request(strm, /*close_connection=*/left == 1, connection_closed,
                         [](httplib::Request&) {});
    current_connection = nullptr;
    strm.EndRequest();
    if (strm.failure() != RequestFailure::kNone) {
      if (on_dropped_) {
        std::string ip;
        int port = 0;
        strm.get_remote_ip_and_port(ip, port);
        on_dropped_(ip + ":" + std::to_string(port), strm.failure());
      }
      ok = false;
      cut_short = true;
      break;
    }
    if (!ok || connection_closed) break;
  }
  if (cut_short) {
    LingeringClose(sock);
  } else {
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
  }
  return ok;
}

}  // namespace infoflow::server::http
