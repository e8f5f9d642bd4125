// infoflow-server: the gRPC service of docs/DESIGN.md §6. SIGTERM/SIGINT shut it
// down gracefully (running calls get a grace period to finish).
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "server/server.h"
#include "server/server_options.h"

namespace {

int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const char c = static_cast<char>(sig);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &c, 1);
}

// Raises the soft limit on open descriptors to the hard one. Connections
// (gRPC, up to 2 x --http-max-connections HTTP), RocksDB's files and the
// Redis sockets all need descriptors, and the usual soft limit of 1024
// (systemd's default) is fewer than the HTTP listener alone may hold.
void RaiseDescriptorLimit() {
  rlimit l{};
  if (getrlimit(RLIMIT_NOFILE, &l) != 0 || l.rlim_cur >= l.rlim_max) return;
  const rlim_t before = l.rlim_cur;
  l.rlim_cur = l.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &l) == 0) {
    std::fprintf(stderr, "open files limit raised from %llu to %llu\n",
                 static_cast<unsigned long long>(before),
                 static_cast<unsigned long long>(l.rlim_cur));
  }
}

}  // namespace

int main(int argc, char** argv) {
  // One glibc malloc arena unless MALLOC_ARENA_MAX says otherwise. The engine
  // runs on worker threads, whose per-thread arenas hand the large prefill
  // buffers back to the kernel and page-fault them in again on every request:
  // measured on 2 cores at 4K context, FULL prefill took 4.14 s on a worker
  // vs 3.10 s in-process, and 3.03 s with one arena (serve_bench overhead
  // column). gRPC's small allocations do not contend measurably.
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 1);
  bool help = false;
  auto options = infoflow::server::ParseServerFlags(argc, argv, &help);
  if (help) {
    std::fputs(infoflow::server::kServerUsage, stdout);
    return 0;
  }
  if (!options.ok()) {
    std::fprintf(stderr, "infoflow-server: %s\n\n%s", std::string(options.status().message()).c_str(),
                 infoflow::server::kServerUsage);
    return 2;
  }
  RaiseDescriptorLimit();
  if (pipe(g_signal_pipe) != 0) return 1;
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  std::signal(SIGPIPE, SIG_IGN);

  auto server = infoflow::server::InfoflowServer::Start(*options);
  if (!server.ok()) {
    std::fprintf(stderr, "infoflow-server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  char sig = 0;
  while (read(g_signal_pipe[0], &sig, 1) < 0) {
  }
  std::fprintf(stderr, "signal %d: shutting down (grace 10s)\n", sig);
  (*server)->Shutdown(std::chrono::seconds(10));
  (*server)->Wait();
  server->reset();
  std::fprintf(stderr, "stopped\n");
  return 0;
}
