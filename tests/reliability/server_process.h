// ServerProcess: the real infoflow-server binary as a child process on
// 127.0.0.1 port 0 (gRPC and /metrics), its ports read back from its log.
// Shared by tests/reliability and tests/bench/serve_bench (header-only, no
// gtest, no torch).
#ifndef INFOFLOW_TESTS_RELIABILITY_SERVER_PROCESS_H_
#define INFOFLOW_TESTS_RELIABILITY_SERVER_PROCESS_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "grpc/health/v1/health.grpc.pb.h"

namespace infoflow::testing {

inline std::string SlurpFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Resident set size of `pid` in KiB (VmRSS of /proc/PID/status), -1 if gone.
inline int64_t RssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// Plain HTTP/1.0 GET of 127.0.0.1:port/path; the body, or "" on failure.
inline std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string resp;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

// Value of a Prometheus sample in `text` -- `name` alone, or with its labels
// exactly as exposed (e.g. `infoflow_process_heap_bytes{state="in_use"}`) --
// -1 if absent.
inline double PromValue(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return -1;
}

class ServerProcess {
 public:
  // `args` are extra flags (e.g. "--workers=2"); --listen/--metrics-listen
  // and --data-dir are set here.
  // `env` entries ("NAME=value") are added to this process's environment.
  ServerProcess(std::string binary, std::string model_dir, std::string data_dir,
                std::string log_path, std::vector<std::string> args = {},
                std::vector<std::string> env = {})
      : binary_(std::move(binary)),
        model_dir_(std::move(model_dir)),
        data_dir_(std::move(data_dir)),
        log_(std::move(log_path)),
        args_(std::move(args)),
        env_(std::move(env)) {}
  ~ServerProcess() { Kill(); }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Starts the binary and waits (up to `timeout`) until it logs its ports.
  // Returns false (with the log in *error) if it died or never listened.
  bool Start(std::string* error, std::chrono::seconds timeout = std::chrono::seconds(60)) {
    Kill();
    std::vector<std::string> argv_s = {binary_,
                                       "--model=" + model_dir_,
                                       "--data-dir=" + data_dir_,
                                       "--listen=127.0.0.1:0",
                                       "--metrics-listen=127.0.0.1:0"};
    argv_s.insert(argv_s.end(), args_.begin(), args_.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_s = env_;
    for (char** e = environ; *e; ++e) env_s.push_back(*e);
    std::vector<char*> envp;
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);
    const int log_fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      *error = "cannot open " + log_;
      return false;
    }
    pid_ = fork();
    if (pid_ == 0) {
      if (address_space_limit_ > 0) {
        const rlimit lim{address_space_limit_, address_space_limit_};
        setrlimit(RLIMIT_AS, &lim);
      }
      dup2(log_fd, STDERR_FILENO);
      dup2(log_fd, STDOUT_FILENO);
      execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    close(log_fd);
    if (pid_ < 0) {
      *error = "fork failed";
      return false;
    }
    const std::regex grpc_re("listening on 127\\.0\\.0\\.1:(\\d+)");
    const std::regex metrics_re("metrics on http://127\\.0\\.0\\.1:(\\d+)/metrics");
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::smatch m;
    std::string text;
    while (std::chrono::steady_clock::now() < deadline) {
      text = SlurpFile(log_);
      if (std::regex_search(text, m, metrics_re)) {  // logged after the gRPC port
        metrics_port_ = std::stoi(m[1]);
        if (std::regex_search(text, m, grpc_re)) port_ = std::stoi(m[1]);
        channel_ = grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
        return true;
      }
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        *error = "server exited at start:\n" + text;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    *error = "server did not listen in time:\n" + text;
    Kill();
    return false;
  }

  // Caps the child's virtual memory (RLIMIT_AS) from the next Start on:
  // past it allocations fail instead of the machine swapping.
  void set_address_space_limit(uint64_t bytes) { address_space_limit_ = bytes; }

  // SIGKILL (no cleanup at all) and reap.
  void Kill() { Signal(SIGKILL); }
  // SIGTERM and wait for a graceful exit; returns the exit status (or -1).
  int Stop() { return Signal(SIGTERM); }

  // False once the child exited (a zombie counts as exited).
  bool Alive() const {
    if (pid_ <= 0) return false;
    siginfo_t info{};
    return waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           info.si_pid == 0;
  }
  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  std::string log() const { return SlurpFile(log_); }
  int64_t RssKiB() const { return testing::RssKiB(pid_); }
  std::string Metrics() const { return HttpGet(metrics_port_, "/metrics"); }

  bool Healthy() const {
    auto health = grpc::health::v1::Health::NewStub(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::health::v1::HealthCheckResponse resp;
    return health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok() &&
           resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  }

 private:
  int Signal(int sig) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    channel_.reset();
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }

  std::string binary_, model_dir_, data_dir_, log_;
  std::vector<std::string> args_, env_;
  pid_t pid_ = -1;
  int port_ = 0;
  int metrics_port_ = 0;
  uint64_t address_space_limit_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace infoflow::testing

#endif  // INFOFLOW_TESTS_RELIABILITY_SERVER_PROCESS_H_
