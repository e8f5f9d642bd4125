// Starts the ranks of a sequence-parallel group as real processes: this
// binary again (/proc/self/exe) with the rank's flags. Rank 0 binds an
// ephemeral port and writes it to a file; the others start once it is
// there. Used by the exactness/fault tests and tests/bench/sp_bench.
#ifndef INFOFLOW_TESTS_DIST_SP_LAUNCH_H_
#define INFOFLOW_TESTS_DIST_SP_LAUNCH_H_

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace infoflow::sp_launch {

inline pid_t Spawn(const std::vector<std::string>& args) {
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  return pid;
}

// Reads the port rank 0 wrote to `path`; 0 after `wait` without one.
inline int WaitForPort(const std::string& path, std::chrono::milliseconds wait) {
  const auto until = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in(path);
    int port = 0;
    std::string done;
    if (in >> port >> done && done == "ok" && port > 0) return port;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

// Rank 0 with `base` + rank flags, waits for its port, then ranks 1..N-1.
// Returns the pids in rank order (empty on failure, rank 0 killed).
inline std::vector<pid_t> LaunchGroup(const std::vector<std::string>& base, int world,
                                      const std::string& port_file) {
  std::remove(port_file.c_str());
  std::vector<pid_t> pids;
  std::vector<std::string> a0 = base;
  a0.insert(a0.end(), {"--sp-rank", "0", "--sp-world", std::to_string(world), "--sp-port", "0",
                       "--sp-port-file", port_file});
  pids.push_back(Spawn(a0));
  const int port = WaitForPort(port_file, std::chrono::seconds(60));
  if (port == 0) {
    kill(pids[0], SIGKILL);
    waitpid(pids[0], nullptr, 0);
    return {};
  }
  for (int r = 1; r < world; ++r) {
    std::vector<std::string> a = base;
    a.insert(a.end(), {"--sp-rank", std::to_string(r), "--sp-world", std::to_string(world),
                       "--sp-port", std::to_string(port)});
    pids.push_back(Spawn(a));
  }
  return pids;
}

// Exit status (or 128 + signal) of `pid`.
inline int WaitExit(pid_t pid) {
  int st = 0;
  if (waitpid(pid, &st, 0) < 0) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace infoflow::sp_launch

#endif  // INFOFLOW_TESTS_DIST_SP_LAUNCH_H_
