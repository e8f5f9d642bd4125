// RedisClusterProcess: a REAL Redis Cluster on 127.0.0.1 for tests and
// benchmarks -- N masters x R replicas of the system's redis-server (7.0 on
// Debian 12), each with --cluster-enabled yes in its own temp dir on free
// ports (client and cluster-bus), joined with `redis-cli --cluster create`,
// ready once every node reports cluster_state:ok and every replica is in
// sync. Killed (SIGKILL) and removed on destruction. Header-only, no gtest.
#ifndef INFOFLOW_TESTS_REMOTE_REDIS_CLUSTER_FIXTURE_H_
#define INFOFLOW_TESTS_REMOTE_REDIS_CLUSTER_FIXTURE_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace infoflow::testing {

// A TCP socket bound to an ephemeral port on 127.0.0.1; with `backlog` > 0
// also listening (the kernel then accepts connections from the backlog even
// though nobody ever answers: a silent node). fd -1 on failure; the caller
// closes fd.
struct LoopbackSocket {
  int fd = -1;
  int port = 0;
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};
inline LoopbackSocket BindLoopback(int backlog = 0) {
  LoopbackSocket s;
  s.fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (s.fd < 0 || bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      (backlog > 0 && listen(s.fd, backlog) != 0) ||
      getsockname(s.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (s.fd >= 0) close(s.fd);
    return LoopbackSocket{};
  }
  s.port = ntohs(a.sin_port);
  return s;
}

// `n` distinct free TCP ports on 127.0.0.1 (all bound at once, then freed).
inline std::vector<int> FreePorts(int n) {
  std::vector<LoopbackSocket> held;
  for (int i = 0; i < n; ++i) held.push_back(BindLoopback());
  std::vector<int> ports;
  for (const LoopbackSocket& s : held) {
    ports.push_back(s.port);
    if (s.fd >= 0) close(s.fd);
  }
  return ports;
}

// One command to 127.0.0.1:port over a fresh connection; the reply as text
// (strings/status as is, integers in decimal, arrays flattened one element
// per line, nil as "(nil)"), errors as "ERR! <message>".
inline std::string RedisAdmin(int port, const std::vector<std::string>& args,
                              const std::string& password = "") {
  timeval tv{2, 0};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (c == nullptr || c->err) {
    std::string e = c ? c->errstr : "oom";
    if (c) redisFree(c);
    return "ERR! connect: " + e;
  }
  redisSetTimeout(c, tv);
  if (!password.empty()) {
    redisReply* a = static_cast<redisReply*>(redisCommand(c, "AUTH %s", password.c_str()));
    if (a) freeReplyObject(a);
  }
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const auto& s : args) {
    argv.push_back(s.data());
    lens.push_back(s.size());
  }
  redisReply* r = static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
  std::string out;
  if (r == nullptr) {
    out = std::string("ERR! io: ") + c->errstr;
  } else {
    std::function<void(const redisReply*)> add = [&](const redisReply* x) {
      switch (x->type) {
        case REDIS_REPLY_STRING:
        case REDIS_REPLY_STATUS:
          out.append(x->str, x->len);
          break;
        case REDIS_REPLY_ERROR:
          out += "ERR! " + std::string(x->str, x->len);
          break;
        case REDIS_REPLY_INTEGER:
          out += std::to_string(x->integer);
          break;
        case REDIS_REPLY_NIL:
          out += "(nil)";
          break;
        case REDIS_REPLY_ARRAY:
          for (size_t i = 0; i < x->elements; ++i) {
            if (i) out += "\n";
            add(x->element[i]);
          }
          break;
      }
    };
    add(r);
    freeReplyObject(r);
  }
  redisFree(c);
  return out;
}

class RedisClusterProcess {
 public:
  struct Node {
    int port = 0;
    int bus_port = 0;
    pid_t pid = -1;
    std::string dir;
  };

  explicit RedisClusterProcess(std::string name) {
    root_ = (std::filesystem::temp_directory_path() /
             ("infoflow_redis_" + std::to_string(getpid()) + "_" + name))
                .string();
  }
  ~RedisClusterProcess() { Stop(); }
  RedisClusterProcess(const RedisClusterProcess&) = delete;
  RedisClusterProcess& operator=(const RedisClusterProcess&) = delete;

  // Starts masters x (1 + replicas) nodes and creates the cluster. False
  // (with the reason in *error) if anything failed.
  bool Start(int masters, int replicas, std::string* error, int node_timeout_ms = 1000,
             const std::string& password = "") {
    Stop();
    password_ = password;
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
    const int n = masters * (1 + replicas);
    std::vector<int> ports = FreePorts(2 * n);
    nodes_.clear();
    for (int i = 0; i < n; ++i) {
      Node node;
      node.port = ports[2 * i];
      node.bus_port = ports[2 * i + 1];
      node.dir = root_ + "/node" + std::to_string(i);
      std::filesystem::create_directories(node.dir);
      nodes_.push_back(node);
      if (!StartNode(i, node_timeout_ms, error)) return false;
    }
    for (const Node& node : nodes_) {
      if (!WaitFor([&] { return RedisAdmin(node.port, {"PING"}, password_) == "PONG"; }, 10)) {
        *error = "redis-server on port " + std::to_string(node.port) + " did not answer PING";
        return false;
      }
    }
    std::string cmd = "redis-cli";
    if (!password_.empty()) cmd += " -a " + password_ + " --no-auth-warning";
    cmd += " --cluster create";
    for (const Node& node : nodes_) cmd += " 127.0.0.1:" + std::to_string(node.port);
    cmd += " --cluster-replicas " + std::to_string(replicas) + " --cluster-yes > " + root_ +
           "/create.log 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      *error = "redis-cli --cluster create failed: see " + root_ + "/create.log";
      return false;
    }
    if (!WaitHealthy(20)) {
      *error = "cluster did not reach cluster_state:ok with replicas in sync";
      return false;
    }
    return true;
  }

  // True once every live node says cluster_state:ok, knows every live
  // master's slots, and every live replica's link to its master is up.
  bool WaitHealthy(int seconds) {
    return WaitFor(
        [&] {
          for (const Node& node : nodes_) {
            if (node.pid <= 0) continue;
            if (RedisAdmin(node.port, {"CLUSTER", "INFO"}, password_).find("cluster_state:ok") ==
                std::string::npos) {
              return false;
            }
            const std::string repl = RedisAdmin(node.port, {"INFO", "replication"}, password_);
            if (repl.find("role:slave") != std::string::npos &&
                repl.find("master_link_status:up") == std::string::npos) {
              return false;
            }
          }
          return true;
        },
        seconds);
  }

  // Seeds for the client: every node, "127.0.0.1:port" comma-separated.
  std::string SeedList() const {
    std::string s;
    for (const Node& node : nodes_) {
      if (!s.empty()) s += ",";
      s += "127.0.0.1:" + std::to_string(node.port);
    }
    return s;
  }
  std::vector<std::string> Seeds() const {
    std::vector<std::string> v;
    for (const Node& node : nodes_) v.push_back("127.0.0.1:" + std::to_string(node.port));
    return v;
  }
  const std::vector<Node>& nodes() const { return nodes_; }

  // Index of the node listening on `port`, -1 if none.
  int IndexOfPort(int port) const {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].port == port) return static_cast<int>(i);
    }
    return -1;
  }
  // The port of the master that serves `slot`, asked of a live node.
  int MasterPortForSlot(int slot) const {
    for (const Node& node : nodes_) {
      if (node.pid <= 0) continue;
      const std::string out = RedisAdmin(node.port, {"CLUSTER", "SLOTS"}, password_);
      // Flattened: start, end, ip, port, id, [replicas ip, port, id]... per
      // range; parse line by line.
      std::vector<std::string> lines;
      size_t pos = 0;
      while (pos <= out.size()) {
        size_t nl = out.find('\n', pos);
        if (nl == std::string::npos) nl = out.size();
        lines.push_back(out.substr(pos, nl - pos));
        pos = nl + 1;
      }
      for (size_t i = 0; i + 3 < lines.size(); ++i) {
        char* e1 = nullptr;
        char* e2 = nullptr;
        const long lo = std::strtol(lines[i].c_str(), &e1, 10);
        const long hi = std::strtol(lines[i + 1].c_str(), &e2, 10);
        if (*e1 == 0 && *e2 == 0 && lines[i + 2] == "127.0.0.1" && lo <= slot && slot <= hi &&
            lo <= hi) {
          return std::atoi(lines[i + 3].c_str());
        }
      }
      return -1;
    }
    return -1;
  }

  // SIGKILL node `i` (no shutdown, no save).
  void Kill(size_t i) {
    if (nodes_[i].pid <= 0) return;
    kill(nodes_[i].pid, SIGKILL);
    int st = 0;
    waitpid(nodes_[i].pid, &st, 0);
    nodes_[i].pid = -1;
  }
  // SIGSTOP / SIGCONT every node: the cluster stops answering (connections
  // are still accepted by the kernel, so commands time out), then resumes.
  void PauseAll() {
    for (const Node& node : nodes_) {
      if (node.pid > 0) kill(node.pid, SIGSTOP);
    }
  }
  void ResumeAll() {
    for (const Node& node : nodes_) {
      if (node.pid > 0) kill(node.pid, SIGCONT);
    }
  }
  void Stop() {
    for (size_t i = 0; i < nodes_.size(); ++i) Kill(i);
    nodes_.clear();
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }

  std::string Admin(size_t i, const std::vector<std::string>& args) const {
    return RedisAdmin(nodes_[i].port, args, password_);
  }

  template <typename F>
  static bool WaitFor(F f, int seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      if (f()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return f();
  }

 private:
  bool StartNode(int i, int node_timeout_ms, std::string* error) {
    Node& node = nodes_[i];
    std::vector<std::string> args = {
        "redis-server",
        "--port", std::to_string(node.port),
        "--cluster-port", std::to_string(node.bus_port),
        "--bind", "127.0.0.1",
        "--cluster-enabled", "yes",
        "--cluster-config-file", node.dir + "/nodes.conf",
        "--cluster-node-timeout", std::to_string(node_timeout_ms),
        // A cache: slots of a dead master without a replica must not stop
        // the others from serving, and a replica may always take over.
        "--cluster-require-full-coverage", "no",
        "--cluster-replica-validity-factor", "0",
        "--dir", node.dir,
        "--save", "",
        "--appendonly", "no",
        "--daemonize", "no",
        "--protected-mode", "no",
        "--proto-max-bulk-len", "512mb",
        "--maxmemory", "1gb",
        "--maxmemory-policy", "allkeys-lru",
        "--logfile", node.dir + "/redis.log"};
    if (!password_.empty()) {
      args.insert(args.end(), {"--requirepass", password_, "--masterauth", password_});
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    node.pid = fork();
    if (node.pid == 0) {
      const int null_fd = open("/dev/null", O_WRONLY);
      dup2(null_fd, STDOUT_FILENO);
      execvp(argv[0], argv.data());
      _exit(127);
    }
    if (node.pid < 0) {
      *error = "fork failed";
      return false;
    }
    return true;
  }

  std::string root_;
  std::string password_;
  std::vector<Node> nodes_;
};

// One cluster per test binary, shared by the tests that do not break it;
// started on first use, stopped when the binary's tests end. Each test file
// registers the teardown once with
//   const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new SharedClusterTeardown);
inline RedisClusterProcess* SharedCluster() {
  static RedisClusterProcess* cluster = [] {
    auto* c = new RedisClusterProcess("shared");
    std::string error;
    if (!c->Start(3, 1, &error)) {
      std::fprintf(stderr, "cannot start the test cluster: %s\n", error.c_str());
      std::abort();
    }
    return c;
  }();
  return cluster;
}

class SharedClusterTeardown : public ::testing::Environment {
 public:
  void TearDown() override { SharedCluster()->Stop(); }
};

}  // namespace infoflow::testing

#endif  // INFOFLOW_TESTS_REMOTE_REDIS_CLUSTER_FIXTURE_H_
