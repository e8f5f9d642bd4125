#include "cache_store/redis_cluster.h"

#include <hiredis/hiredis.h>
#include <unistd.h>
#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cache_store/record_buffers.h"

namespace infoflow::store {
namespace {

// Debian's absl has its own string_view type.
absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr std::array<uint16_t, 256> MakeCrc16Table() {
  std::array<uint16_t, 256> t{};
  for (int i = 0; i < 256; ++i) {
    uint16_t crc = static_cast<uint16_t>(i << 8);
    for (int b = 0; b < 8; ++b) {
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<uint16_t>(crc << 1);
    }
    t[i] = crc;
  }
  return t;
}
constexpr std::array<uint16_t, 256> kCrc16Table = MakeCrc16Table();

struct ContextDeleter {
  void operator()(redisContext* c) const {
    if (c != nullptr) redisFree(c);
  }
};
using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r != nullptr) freeReplyObject(r);
  }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

timeval ToTimeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

bool SplitHostPort(std::string_view addr, std::string* host, int* port) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  int p = 0;
  if (!absl::SimpleAtoi(AV(addr.substr(colon + 1)), &p) || p < 1 || p > 65535) return false;
  *host = std::string(addr.substr(0, colon));
  *port = p;
  return true;
}

// The status for a context whose last operation failed. hiredis 0.14 has no
// timeout error code: a socket timeout is an I/O error with EAGAIN's text
// (reads/writes) or ETIMEDOUT's (connect).
absl::Status ContextError(const redisContext* c, std::string_view addr, std::string_view what) {
  const std::string msg = absl::StrCat("redis ", AV(addr), ": ", AV(what), ": ", c->errstr);
  if (c->err == REDIS_ERR_IO && (std::strstr(c->errstr, "temporarily unavailable") != nullptr ||
                                 std::strstr(c->errstr, "timed out") != nullptr)) {
    return absl::DeadlineExceededError(msg);
  }
  return absl::UnavailableError(msg);
}

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381".
bool ParseRedirect(std::string_view msg_in, std::string_view verb, int* slot, std::string* addr) {
  absl::string_view msg = AV(msg_in);
  if (!absl::ConsumePrefix(&msg, AV(verb)) || !absl::ConsumePrefix(&msg, " ")) return false;
  const size_t sp = msg.find(' ');
  if (sp == absl::string_view::npos) return false;
  if (!absl::SimpleAtoi(msg.substr(0, sp), slot) || *slot < 0 || *slot >= kRedisClusterSlots) {
    return false;
  }
  *addr = std::string(msg.substr(sp + 1));
  // Redis 7 may answer ":port" when it does not know its own address.
  return !addr->empty();
}

// Reads RESP2 replies straight from a hiredis connection's socket. Why not
// hiredis's reader: it reads 16 KiB at a time into one buffer that grows by
// 1 MiB steps (realloc + copy) and then copies each bulk string out again,
// so a pipeline of multi-MiB chunk records moved every byte many times
// (0.4 GB/s measured). Here a bulk string is read into its final
// std::string, sized once from the length header. Timeouts come from the
// socket (SO_RCVTIMEO, set by redisSetTimeout).
class RespReader {
 public:
  RespReader(redisContext* c, std::string_view addr) : c_(c), addr_(addr) {}

  absl::Status Read(RedisReply* out) {
    std::string line;
    if (absl::Status s = ReadLine(&line); !s.ok()) return s;
    if (line.empty()) return Protocol("empty reply line");
    const char type = line[0];
    const std::string_view rest = std::string_view(line).substr(1);
    long long n = 0;
    switch (type) {
      case '+':
        out->type = RedisReply::Type::kStatus;
        out->str = std::string(rest);
        return absl::OkStatus();
      case '-':
        out->type = RedisReply::Type::kError;
        out->str = std::string(rest);
        return absl::OkStatus();
      case ':':
        if (!absl::SimpleAtoi(AV(rest), &n)) return Protocol("bad integer");
        out->type = RedisReply::Type::kInteger;
        out->integer = n;
        return absl::OkStatus();
      case '$': {
        if (!absl::SimpleAtoi(AV(rest), &n) || n < -1 || n > (int64_t{1} << 32)) {
          return Protocol("bad bulk length");
        }
        if (n == -1) {
          out->type = RedisReply::Type::kNil;
          return absl::OkStatus();
        }
        out->type = RedisReply::Type::kString;
        // + CRLF. A large value (a chunk record) reads into a recycled
        // buffer: no allocation, zero-fill or page faults (record_buffers.h).
        out->str = RecordBuffers::Default().Take(static_cast<size_t>(n) + 2);
        if (absl::Status s = ReadExact(out->str.data(), out->str.size()); !s.ok()) return s;
        if (out->str[n] != '\r' || out->str[n + 1] != '\n') return Protocol("bulk without CRLF");
        out->str.resize(static_cast<size_t>(n));
        return absl::OkStatus();
      }
      case '*': {
        if (!absl::SimpleAtoi(AV(rest), &n) || n < -1) return Protocol("bad array length");
        out->type = n == -1 ? RedisReply::Type::kNil : RedisReply::Type::kArray;
        out->integer = n;
        for (long long i = 0; i < n; ++i) {  // not used by our commands: skip
          RedisReply ignored;
          if (absl::Status s = Read(&ignored); !s.ok()) return s;
        }
        return absl::OkStatus();
      }
      default:
        return Protocol("unknown reply type");
    }
  }

 private:
  absl::Status ReadLine(std::string* line) {
    for (;;) {
      const size_t nl = buf_.find("\r\n", pos_);
      if (nl != std::string::npos) {
        line->assign(buf_, pos_, nl - pos_);
        pos_ = nl + 2;
        return absl::OkStatus();
      }
      if (absl::Status s = Fill(); !s.ok()) return s;
    }
  }
  // Buffered bytes first, then straight from the socket into `dst`.
  absl::Status ReadExact(char* dst, size_t n) {
    const size_t have = std::min(n, buf_.size() - pos_);
    std::memcpy(dst, buf_.data() + pos_, have);
    pos_ += have;
    size_t got = have;
    while (got < n) {
      const ssize_t r = ::read(c_->fd, dst + got, n - got);
      if (r > 0) {
        got += static_cast<size_t>(r);
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      return Fail(r);
    }
    return absl::OkStatus();
  }
  absl::Status Fill() {
    if (pos_ > 0) {
      buf_.erase(0, pos_);
      pos_ = 0;
    }
    char tmp[16384];
    for (;;) {
      const ssize_t r = ::read(c_->fd, tmp, sizeof tmp);
      if (r > 0) {
        buf_.append(tmp, static_cast<size_t>(r));
        return absl::OkStatus();
      }
      if (r < 0 && errno == EINTR) continue;
      return Fail(r);
    }
  }
  // Marks the connection broken (Release drops it) and says why.
  absl::Status Fail(ssize_t r) {
    const bool timeout = r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    const std::string what = r == 0 ? "connection closed" : std::strerror(errno);
    c_->err = r == 0 ? REDIS_ERR_EOF : REDIS_ERR_IO;
    std::snprintf(c_->errstr, sizeof c_->errstr, "%s", what.c_str());
    const std::string msg = absl::StrCat("redis ", AV(addr_), ": read: ", what);
    return timeout ? absl::DeadlineExceededError(msg) : absl::UnavailableError(msg);
  }
  absl::Status Protocol(std::string_view what) {
    c_->err = REDIS_ERR_PROTOCOL;
    std::snprintf(c_->errstr, sizeof c_->errstr, "protocol error");
    return absl::InternalError(absl::StrCat("redis ", AV(addr_), ": ", AV(what)));
  }

  redisContext* c_;
  std::string_view addr_;
  std::string buf_;
  size_t pos_ = 0;
};

bool IsTransientClusterError(std::string_view msg_in) {
  const absl::string_view msg = AV(msg_in);
  return absl::StartsWith(msg, "TRYAGAIN") || absl::StartsWith(msg, "CLUSTERDOWN") ||
         absl::StartsWith(msg, "LOADING") || absl::StartsWith(msg, "MASTERDOWN");
}

}  // namespace

uint16_t RedisCluster::Crc16(std::string_view bytes) {
  uint16_t crc = 0;
  for (unsigned char ch : bytes) {
    crc = static_cast<uint16_t>((crc << 8) ^ kCrc16Table[((crc >> 8) ^ ch) & 0xff]);
  }
  return crc;
}

int RedisCluster::KeySlot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close != open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return Crc16(key) & (kRedisClusterSlots - 1);
}

const char* RedisErrorKind(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kDeadlineExceeded:
      return "timeout";
    case absl::StatusCode::kUnavailable:
      return "connection";
    case absl::StatusCode::kAborted:
      return "redirect_exhausted";
    case absl::StatusCode::kFailedPrecondition:
      return "circuit_open";
    default:
      return "server";
  }
}

absl::StatusOr<std::vector<std::string>> ParseRedisSeeds(std::string_view list) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(AV(list), ',')) {
    part = absl::StripAsciiWhitespace(part);
    std::string host;
    int port = 0;
    if (part.empty() || !SplitHostPort(std::string_view(part.data(), part.size()), &host, &port)) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected host:port[,host:port...], got '", part, "'"));
    }
    out.emplace_back(part);
  }
  if (out.empty()) return absl::InvalidArgumentError("no seed node given");
  return out;
}

// RedisClusterOptions::max_parallel_nodes resolved: 0 = no bound.
static size_t ParallelNodesFor(int requested) {
  return requested > 0 ? static_cast<size_t>(requested) : SIZE_MAX;
}

class RedisCluster::Impl {
 public:
  Impl(RedisClusterOptions options, RedisClusterCounters* counters)
      : options_(std::move(options)),
        counters_(counters),
        parallel_nodes_(ParallelNodesFor(options_.max_parallel_nodes)),
        pipeline_depth_(static_cast<size_t>(std::max(1, options_.max_pipeline_depth))),
        slots_(kRedisClusterSlots) {}

  std::vector<absl::StatusOr<RedisReply>> Execute(absl::Span<const RedisCommand> commands);
  absl::Status Refresh(bool force);
  std::string NodeForSlot(int slot) const {
    std::shared_lock<std::shared_mutex> lock(map_mu_);
    return slots_[slot];
  }
  bool circuit_open() const {
    return counters_->breaker_state.load(std::memory_order_relaxed) != 0;
  }

 private:
  struct Pool {
    std::mutex mu;
    std::vector<ContextPtr> idle;
  };
  // Per command progress inside Execute.
  struct Route {
    std::string addr;
    bool asking = false;
    int redirects = 0;
    int attempts = 0;
    bool done = false;
    absl::Status last_error;  // of the last network attempt
  };

  absl::StatusOr<ContextPtr> Connect(const std::string& addr);
  absl::StatusOr<ContextPtr> Acquire(const std::string& addr);
  void Release(const std::string& addr, ContextPtr c);
  // Sends commands[idx] for idx in `items` as one pipeline to `addr`; one
  // result per item (a network failure fails the item and every later one).
  std::vector<absl::StatusOr<RedisReply>> Pipeline(const std::string& addr,
                                                   absl::Span<const RedisCommand> commands,
                                                   const std::vector<size_t>& items,
                                                   const std::vector<Route>& routes);
  std::string AddrForKey(std::string_view key, size_t salt) const;
  void SetSlot(int slot, const std::string& addr) {
    std::unique_lock<std::shared_mutex> lock(map_mu_);
    slots_[slot] = addr;
  }

  // Circuit breaker.
  bool BreakerAllow();
  void BreakerSuccess();
  void BreakerFailure();

  const RedisClusterOptions options_;
  RedisClusterCounters* const counters_;
  const size_t parallel_nodes_;  // options_.max_parallel_nodes resolved
  const size_t pipeline_depth_;  // options_.max_pipeline_depth, at least 1

  mutable std::shared_mutex map_mu_;
  std::vector<std::string> slots_;    // master per slot, "" = unknown
  std::vector<std::string> masters_;  // distinct masters of the last map

  std::mutex refresh_mu_;
  std::chrono::steady_clock::time_point last_refresh_{};

  std::mutex pools_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Pool>> pools_;

  std::mutex breaker_mu_;
  std::atomic<int> consecutive_failures_{0};
  std::chrono::steady_clock::time_point open_until_{};
};

absl::StatusOr<ContextPtr> RedisCluster::Impl::Connect(const std::string& addr) {
  std::string host;
  int port = 0;
  if (!SplitHostPort(addr, &host, &port)) {
    return absl::UnavailableError(absl::StrCat("redis: bad node address '", addr, "'"));
  }
  const timeval tv = ToTimeval(options_.timeout);
  ContextPtr c(redisConnectWithTimeout(host.c_str(), port, tv));
  if (c == nullptr) return absl::UnavailableError(absl::StrCat("redis ", addr, ": out of memory"));
  if (c->err) {
    counters_->connect_failures.fetch_add(1, std::memory_order_relaxed);
    return ContextError(c.get(), addr, "connect");
  }
  redisSetTimeout(c.get(), tv);
  redisEnableKeepAlive(c.get());
  // Keep the reader's buffer between replies: records are megabytes, and
  // hiredis would otherwise free and regrow it for every one.
  c->reader->maxbuf = 0;
  counters_->connects.fetch_add(1, std::memory_order_relaxed);
  if (!options_.password.empty()) {
    std::vector<const char*> argv = {"AUTH"};
    std::vector<size_t> lens = {4};
    if (!options_.user.empty()) {
      argv.push_back(options_.user.data());
      lens.push_back(options_.user.size());
    }
    argv.push_back(options_.password.data());
    lens.push_back(options_.password.size());
    ReplyPtr r(static_cast<redisReply*>(
        redisCommandArgv(c.get(), static_cast<int>(argv.size()), argv.data(), lens.data())));
    if (r == nullptr) return ContextError(c.get(), addr, "AUTH");
    if (r->type == REDIS_REPLY_ERROR) {
      counters_->connect_failures.fetch_add(1, std::memory_order_relaxed);
      return absl::UnavailableError(
          absl::StrCat("redis ", addr, ": AUTH refused: ", absl::string_view(r->str, r->len)));
    }
  }
  return c;
}

absl::StatusOr<ContextPtr> RedisCluster::Impl::Acquire(const std::string& addr) {
  Pool* pool;
  {
    std::lock_guard<std::mutex> lock(pools_mu_);
    std::unique_ptr<Pool>& p = pools_[addr];
    if (p == nullptr) p = std::make_unique<Pool>();
    pool = p.get();
  }
  {
    std::lock_guard<std::mutex> lock(pool->mu);
    if (!pool->idle.empty()) {
      ContextPtr c = std::move(pool->idle.back());
      pool->idle.pop_back();
      return c;
    }
  }
  return Connect(addr);
}

void RedisCluster::Impl::Release(const std::string& addr, ContextPtr c) {
  if (c == nullptr || c->err) return;  // broken: dropped, reconnect next time
  Pool* pool;
  {
    std::lock_guard<std::mutex> lock(pools_mu_);
    pool = pools_[addr].get();
  }
  if (pool == nullptr) return;
  std::lock_guard<std::mutex> lock(pool->mu);
  if (static_cast<int>(pool->idle.size()) < options_.max_idle_per_node) {
    pool->idle.push_back(std::move(c));
  }
}

std::vector<absl::StatusOr<RedisReply>> RedisCluster::Impl::Pipeline(
    const std::string& addr, absl::Span<const RedisCommand> commands,
    const std::vector<size_t>& items, const std::vector<Route>& routes) {
  std::vector<absl::StatusOr<RedisReply>> out;
  out.reserve(items.size());
  absl::StatusOr<ContextPtr> conn = Acquire(addr);
  if (!conn.ok()) {
    for (size_t i = 0; i < items.size(); ++i) out.push_back(conn.status());
    return out;
  }
  redisContext* c = conn->get();
  static const char* kAsking[] = {"ASKING"};
  static const size_t kAskingLen[] = {6};
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  absl::Status broken;
  size_t sent = 0;  // items[0, sent) are written
  // Appends items[sent, end) to the output buffer and writes it out.
  auto send_until = [&](size_t end) {
    for (; sent < end; ++sent) {
      const size_t idx = items[sent];
      if (routes[idx].asking) redisAppendCommandArgv(c, 1, kAsking, kAskingLen);
      const RedisCommand& cmd = commands[idx];
      argv.clear();
      lens.clear();
      for (std::string_view a : cmd.args) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      redisAppendCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data());
    }
    for (int done = 0; !done;) {
      if (redisBufferWrite(c, &done) != REDIS_OK) {
        broken = ContextError(c, addr, "write");
        return;
      }
    }
  };
  // RedisClusterOptions::max_pipeline_depth: the first command alone; after
  // a small reply up to pipeline_depth_ in flight, after a large one only
  // one, so the node never holds the replies of many large values at once.
  send_until(std::min<size_t>(items.size(), 1));
  RespReader reader(c, addr);
  for (size_t k = 0; k < items.size(); ++k) {
    const size_t idx = items[k];
    if (!broken.ok()) {
      out.push_back(broken);
      continue;
    }
    RedisReply reply;
    if (routes[idx].asking) {
      broken = reader.Read(&reply);  // +OK of ASKING
      if (!broken.ok()) {
        out.push_back(broken);
        continue;
      }
    }
    broken = reader.Read(&reply);
    if (!broken.ok()) {
      out.push_back(broken);
      continue;
    }
    const size_t depth = reply.str.size() >= options_.large_reply_bytes ? 1 : pipeline_depth_;
    out.push_back(std::move(reply));
    if (sent < items.size()) send_until(std::min(items.size(), k + 1 + depth));
  }
  if (!broken.ok()) counters_->io_failures.fetch_add(1, std::memory_order_relaxed);
  Release(addr, *std::move(conn));
  return out;
}

std::string RedisCluster::Impl::AddrForKey(std::string_view key, size_t salt) const {
  const int slot = KeySlot(key);
  std::shared_lock<std::shared_mutex> lock(map_mu_);
  if (!slots_[slot].empty()) return slots_[slot];
  // Unknown slot (no map yet, or the slot is uncovered): ask any node; it
  // answers MOVED or CLUSTERDOWN.
  if (!masters_.empty()) return masters_[salt % masters_.size()];
  return options_.seeds[salt % options_.seeds.size()];
}

absl::Status RedisCluster::Impl::Refresh(bool force) {
  std::lock_guard<std::mutex> lock(refresh_mu_);
  const auto now = std::chrono::steady_clock::now();
  // Many callers that saw the same MOVED or the same dead node need one
  // refresh, not one each.
  if (!force && now - last_refresh_ < std::chrono::milliseconds(100)) return absl::OkStatus();
  std::vector<std::string> candidates;
  {
    std::shared_lock<std::shared_mutex> mlock(map_mu_);
    candidates = masters_;
  }
  for (const std::string& s : options_.seeds) {
    if (std::find(candidates.begin(), candidates.end(), s) == candidates.end()) {
      candidates.push_back(s);
    }
  }
  last_refresh_ = now;
  absl::Status last = absl::UnavailableError("redis: no node to ask for the slot map");
  for (const std::string& addr : candidates) {
    absl::StatusOr<ContextPtr> conn = Acquire(addr);
    if (!conn.ok()) {
      last = conn.status();
      continue;
    }
    ReplyPtr r(static_cast<redisReply*>(redisCommand(conn->get(), "CLUSTER SLOTS")));
    if (r == nullptr) {
      last = ContextError(conn->get(), addr, "CLUSTER SLOTS");
      continue;  // conn dropped
    }
    if (r->type != REDIS_REPLY_ARRAY) {
      last = absl::InternalError(absl::StrCat(
          "redis ", addr, ": CLUSTER SLOTS: ",
          r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : "not an array"));
      Release(addr, *std::move(conn));
      continue;
    }
    std::string asked_host;
    int asked_port = 0;
    SplitHostPort(addr, &asked_host, &asked_port);
    std::vector<std::string> slots(kRedisClusterSlots);
    std::vector<std::string> masters;
    for (size_t i = 0; i < r->elements; ++i) {
      const redisReply* e = r->element[i];
      if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
          e->element[0]->type != REDIS_REPLY_INTEGER ||
          e->element[1]->type != REDIS_REPLY_INTEGER ||
          e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2) {
        continue;
      }
      const redisReply* node = e->element[2];
      if (node->element[0]->type != REDIS_REPLY_STRING ||
          node->element[1]->type != REDIS_REPLY_INTEGER) {
        continue;
      }
      std::string host(node->element[0]->str, node->element[0]->len);
      if (host.empty() || host == "?") host = asked_host;
      const std::string maddr = absl::StrCat(host, ":", node->element[1]->integer);
      const long long lo = std::max<long long>(0, e->element[0]->integer);
      const long long hi = std::min<long long>(kRedisClusterSlots - 1, e->element[1]->integer);
      for (long long s = lo; s <= hi; ++s) slots[s] = maddr;
      if (std::find(masters.begin(), masters.end(), maddr) == masters.end()) {
        masters.push_back(maddr);
      }
    }
    Release(addr, *std::move(conn));
    {
      std::unique_lock<std::shared_mutex> mlock(map_mu_);
      slots_ = std::move(slots);
      masters_ = std::move(masters);
    }
    counters_->slot_map_refreshes.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  return last;
}

bool RedisCluster::Impl::BreakerAllow() {
  if (counters_->breaker_state.load(std::memory_order_acquire) == 0) return true;
  std::lock_guard<std::mutex> lock(breaker_mu_);
  const int state = counters_->breaker_state.load(std::memory_order_relaxed);
  if (state == 0) return true;
  if (state == 1 && std::chrono::steady_clock::now() >= open_until_) {
    counters_->breaker_state.store(2, std::memory_order_release);  // this caller probes
    return true;
  }
  counters_->breaker_rejections.fetch_add(1, std::memory_order_relaxed);
  return false;
}

void RedisCluster::Impl::BreakerSuccess() {
  consecutive_failures_.store(0, std::memory_order_relaxed);
  if (counters_->breaker_state.load(std::memory_order_acquire) == 0) return;
  std::lock_guard<std::mutex> lock(breaker_mu_);
  counters_->breaker_state.store(0, std::memory_order_release);
}

void RedisCluster::Impl::BreakerFailure() {
  const int n = consecutive_failures_.fetch_add(1, std::memory_order_relaxed) + 1;
  std::lock_guard<std::mutex> lock(breaker_mu_);
  const int state = counters_->breaker_state.load(std::memory_order_relaxed);
  if (state == 2 || (state == 0 && n >= options_.breaker_threshold)) {
    open_until_ = std::chrono::steady_clock::now() + options_.breaker_cooldown;
    counters_->breaker_state.store(1, std::memory_order_release);
    counters_->breaker_opens.fetch_add(1, std::memory_order_relaxed);
  }
}

std::vector<absl::StatusOr<RedisReply>> RedisCluster::Impl::Execute(
    absl::Span<const RedisCommand> commands) {
  const size_t n = commands.size();
  std::vector<absl::StatusOr<RedisReply>> results(n, absl::UnknownError("not run"));
  if (n == 0) return results;
  if (!BreakerAllow()) {
    for (auto& r : results) {
      r = absl::FailedPreconditionError("redis cluster: circuit open after repeated failures");
    }
    return results;
  }
  {
    bool empty_map;
    {
      std::shared_lock<std::shared_mutex> lock(map_mu_);
      empty_map = masters_.empty();
    }
    if (empty_map && !Refresh(/*force=*/false).ok()) {
      // Nothing answered: that counts toward the breaker like a failed
      // command, so an unreachable cluster opens it after a few calls.
      BreakerFailure();
      if (counters_->breaker_state.load(std::memory_order_relaxed) == 1) {
        for (auto& r : results) {
          r = absl::UnavailableError("redis cluster: no node answered CLUSTER SLOTS");
        }
        return results;
      }
    }
  }
  std::vector<Route> routes(n);
  for (size_t i = 0; i < n; ++i) {
    routes[i].addr = AddrForKey(commands[i].args[commands[i].key_index], i);
  }
  bool probing = counters_->breaker_state.load(std::memory_order_relaxed) == 2;
  // The probe after a cool-down asks for the current slot map first: the
  // cluster may have failed over while the circuit was open.
  if (probing) (void)Refresh(/*force=*/false);
  for (;;) {
    std::map<std::string, std::vector<size_t>> groups;
    for (size_t i = 0; i < n; ++i) {
      if (!routes[i].done) groups[routes[i].addr].push_back(i);
    }
    if (groups.empty()) break;
    // One pipeline per node, at most parallel_nodes_ at once; this thread
    // is one of the workers. Each worker takes the next node not yet read.
    std::vector<std::pair<const std::string*, const std::vector<size_t>*>> jobs;
    for (const auto& [addr, items] : groups) jobs.emplace_back(&addr, &items);
    std::vector<std::vector<absl::StatusOr<RedisReply>>> replies(jobs.size());
    std::atomic<size_t> next_job{0};
    auto work = [&] {
      for (size_t j; (j = next_job.fetch_add(1, std::memory_order_relaxed)) < jobs.size();) {
        replies[j] = Pipeline(*jobs[j].first, commands, *jobs[j].second, routes);
      }
    };
    std::vector<std::thread> threads;
    const size_t workers = std::min(jobs.size(), parallel_nodes_);
    for (size_t w = 1; w < workers; ++w) threads.emplace_back(work);
    work();
    for (std::thread& t : threads) t.join();

    bool refresh = false;
    for (size_t j = 0; j < jobs.size(); ++j) {
      bool node_failed = false;
      const std::vector<size_t>& items = *jobs[j].second;
      for (size_t k = 0; k < items.size(); ++k) {
        const size_t i = items[k];
        Route& rt = routes[i];
        absl::StatusOr<RedisReply>& r = replies[j][k];
        rt.asking = false;
        if (!r.ok()) {
          node_failed = true;
          rt.last_error = r.status();
          // A timeout is not retried: the node is alive but slow or
          // silent, and a retry would double the delay it adds.
          if (++rt.attempts >= options_.max_attempts || absl::IsDeadlineExceeded(r.status())) {
            rt.done = true;
            results[i] = r.status();
          } else {
            refresh = true;
            rt.addr.clear();  // re-route after the refresh
          }
          continue;
        }
        if (r->type == RedisReply::Type::kError) {
          int slot = 0;
          std::string to;
          if (ParseRedirect(r->str, "MOVED", &slot, &to)) {
            counters_->moved.fetch_add(1, std::memory_order_relaxed);
            SetSlot(slot, to);
            refresh = true;
            rt.addr = to;
          } else if (ParseRedirect(r->str, "ASK", &slot, &to)) {
            counters_->ask.fetch_add(1, std::memory_order_relaxed);
            rt.addr = to;
            rt.asking = true;
          } else if (IsTransientClusterError(r->str)) {
            if (++rt.attempts >= options_.max_attempts) {
              rt.done = true;
              results[i] = absl::UnavailableError(absl::StrCat("redis ", *jobs[j].first, ": ", r->str));
            } else {
              refresh = true;
              rt.addr.clear();
            }
            continue;
          } else {
            rt.done = true;
            results[i] = *std::move(r);
            continue;
          }
          if (++rt.redirects > options_.max_redirects) {
            rt.done = true;
            results[i] = absl::AbortedError(absl::StrCat(
                "redis: more than ", options_.max_redirects, " redirects, last: ", r->str));
          }
          continue;
        }
        rt.done = true;
        results[i] = *std::move(r);
      }
      if (node_failed) BreakerFailure();
      else BreakerSuccess();
    }
    if (refresh) {
      // Also when the breaker just opened: the next probe then goes to the
      // node that serves the slot now (e.g. the replica that took over).
      if (!Refresh(/*force=*/false).ok()) BreakerFailure();
      for (size_t i = 0; i < n; ++i) {
        if (!routes[i].done && routes[i].addr.empty()) {
          routes[i].addr = AddrForKey(commands[i].args[commands[i].key_index], i);
        }
      }
    }
    if (probing || circuit_open()) {
      // An open breaker (or a failed probe) ends every pending command now,
      // with its own last network error when it had one.
      if (counters_->breaker_state.load(std::memory_order_relaxed) == 1) {
        for (size_t i = 0; i < n; ++i) {
          if (routes[i].done) continue;
          routes[i].done = true;
          results[i] = !routes[i].last_error.ok()
                           ? routes[i].last_error
                           : absl::FailedPreconditionError(
                                 "redis cluster: circuit open after repeated failures");
        }
        break;
      }
      probing = false;
    }
  }
  return results;
}

RedisCluster::RedisCluster(std::unique_ptr<Impl> impl, RedisClusterCounters* counters)
    : impl_(std::move(impl)), counters_(counters) {}

RedisCluster::~RedisCluster() = default;

absl::StatusOr<std::unique_ptr<RedisCluster>> RedisCluster::Create(RedisClusterOptions options,
                                                                   RedisClusterCounters* counters) {
  if (options.seeds.empty()) return absl::InvalidArgumentError("redis cluster: no seed node");
  for (const std::string& s : options.seeds) {
    std::string host;
    int port = 0;
    if (!SplitHostPort(s, &host, &port)) {
      return absl::InvalidArgumentError(absl::StrCat("redis cluster: seed '", s,
                                                     "' is not host:port"));
    }
  }
  if (options.timeout.count() <= 0) {
    return absl::InvalidArgumentError("redis cluster: timeout must be > 0 ms");
  }
  options.max_attempts = std::max(1, options.max_attempts);
  options.max_redirects = std::max(0, options.max_redirects);
  options.breaker_threshold = std::max(1, options.breaker_threshold);
  std::unique_ptr<RedisClusterCounters> own;
  if (counters == nullptr) {
    own = std::make_unique<RedisClusterCounters>();
    counters = own.get();
  }
  auto impl = std::make_unique<Impl>(std::move(options), counters);
  (void)impl->Refresh(/*force=*/true);  // best effort; see the contract
  std::unique_ptr<RedisCluster> c(new RedisCluster(std::move(impl), counters));
  c->own_counters_ = std::move(own);
  return c;
}

std::vector<absl::StatusOr<RedisReply>> RedisCluster::Execute(
    absl::Span<const RedisCommand> commands) {
  return impl_->Execute(commands);
}

absl::StatusOr<std::optional<std::string>> RedisCluster::Get(std::string_view key) {
  std::string k(key);
  return std::move(MultiGet(absl::MakeConstSpan(&k, 1))[0]);
}

std::vector<absl::StatusOr<std::optional<std::string>>> RedisCluster::MultiGet(
    absl::Span<const std::string> keys) {
  std::vector<RedisCommand> cmds(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) cmds[i].args = {"GET", keys[i]};
  std::vector<absl::StatusOr<RedisReply>> replies = impl_->Execute(cmds);
  std::vector<absl::StatusOr<std::optional<std::string>>> out;
  out.reserve(keys.size());
  for (auto& r : replies) {
    if (!r.ok()) {
      out.push_back(r.status());
    } else if (r->type == RedisReply::Type::kString) {
      out.push_back(std::optional<std::string>(std::move(r->str)));
    } else if (r->type == RedisReply::Type::kNil) {
      out.push_back(std::optional<std::string>());
    } else {
      out.push_back(absl::InternalError(absl::StrCat("redis GET: ", r->str)));
    }
  }
  return out;
}

absl::Status RedisCluster::Set(std::string_view key, std::string_view value, int64_t ttl_seconds) {
  RedisCommand cmd;
  const std::string ttl = absl::StrCat(ttl_seconds);
  cmd.args = {"SET", key, value};
  if (ttl_seconds > 0) {
    cmd.args.push_back("EX");
    cmd.args.push_back(ttl);
  }
  absl::StatusOr<RedisReply> r = std::move(impl_->Execute(absl::MakeConstSpan(&cmd, 1))[0]);
  if (!r.ok()) return r.status();
  if (r->type != RedisReply::Type::kStatus) {
    return absl::InternalError(absl::StrCat("redis SET: ", r->str));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> RedisCluster::Del(std::string_view key) {
  RedisCommand cmd;
  cmd.args = {"DEL", key};
  absl::StatusOr<RedisReply> r = std::move(impl_->Execute(absl::MakeConstSpan(&cmd, 1))[0]);
  if (!r.ok()) return r.status();
  if (r->type != RedisReply::Type::kInteger) {
    return absl::InternalError(absl::StrCat("redis DEL: ", r->str));
  }
  return r->integer > 0;
}

absl::Status RedisCluster::RefreshSlotMap() { return impl_->Refresh(/*force=*/true); }
std::string RedisCluster::NodeForSlot(int slot) const {
  if (slot < 0 || slot >= kRedisClusterSlots) return "";
  return impl_->NodeForSlot(slot);
}
bool RedisCluster::circuit_open() const { return impl_->circuit_open(); }

}  // namespace infoflow::store
