// Durability under SIGKILL: a child process streams durable Puts and
// reports each acknowledged one through a pipe; the parent kills it at a
// random moment, reopens the store, and checks every acknowledged record is
// present and intact. Repeated on the same directory, so recovery also runs
// on top of earlier crashes.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cache_store/chunk_store.h"
#include "gtest/gtest.h"
#include "tests/store/store_test_util.h"
#include "tests/store/test_records.h"

namespace infoflow::store {
namespace {

using testing::MakeRecord;
using testing::RecordShape;

RecordShape ShapeForSeed(uint64_t seed) {  // must match store_crash_helper
  RecordShape shape;
  if (seed % 2 == 1) {
    shape.n_kv_heads = 4;
    shape.head_dim = 64;
    shape.n_tokens = 64;
  }
  return shape;
}

// Starts the helper; returns its pid and the read end of its stdout.
pid_t Spawn(const std::string& db, uint64_t first_seed, int* read_fd) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  const std::string seed = std::to_string(first_seed);
  const pid_t pid = fork();
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    dup2(fds[1], STDOUT_FILENO);
    char* const args[] = {const_cast<char*>(STORE_CRASH_HELPER_PATH),
                          const_cast<char*>(db.c_str()),
                          const_cast<char*>(seed.c_str()), nullptr};
    execv(STORE_CRASH_HELPER_PATH, args);
    _exit(127);
  }
  close(fds[1]);
  *read_fd = fds[0];
  return pid;
}

TEST(StoreCrashTest, SigkillDuringDurablePutsLosesNoAcknowledgedPut) {
  testing::TempDir dir;
  std::mt19937 rng(12345);
  constexpr int kKills = 24;
  uint64_t total_acked = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < kKills; ++round) {
    const uint64_t first_seed = uint64_t{1000000} * (round + 1);
    int fd = -1;
    const pid_t pid = Spawn(dir.path(), first_seed, &fd);
    ASSERT_GT(pid, 0);
    // Wait for the first ack (the store is open and writing), then let it
    // run a random while so the kill lands at varied points of a Put.
    std::vector<uint64_t> acked;
    uint64_t seed;
    ASSERT_EQ(read(fd, &seed, sizeof(seed)), static_cast<ssize_t>(sizeof(seed)))
        << "helper died before its first ack (round " << round << ")";
    acked.push_back(seed);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 150000));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int wstatus = 0;
    ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
        << "helper exited on its own, status " << wstatus;
    // Everything written to the pipe before the kill is still readable.
    ssize_t n;
    while ((n = read(fd, &seed, sizeof(seed))) == sizeof(seed)) {
      acked.push_back(seed);
    }
    close(fd);

    ChunkStoreOptions o;
    o.path = dir.path();
    o.ram_tier_bytes = 0;
    auto store = ChunkStore::Open(o);
    ASSERT_TRUE(store.ok()) << "round " << round << ": " << store.status();
    for (uint64_t s : acked) {
      const auto rec = MakeRecord(s, ShapeForSeed(s));
      auto got = (*store)->Get(rec.key);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->status, GetStatus::kFound)
          << "round " << round << ": acknowledged seed " << s << " lost";
      ASSERT_EQ(got->value->bytes(), rec.bytes);
    }
    // At most one Put was in flight beyond the acknowledged ones.
    const StoreStats st = (*store)->Stats();
    total_acked += acked.size();
    EXPECT_GE(st.records, total_acked);
    EXPECT_LE(st.records, total_acked + kKills);
    EXPECT_EQ(st.corrupt, 0u);
  }
  const double secs = std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - start)
                          .count();
  std::printf("[ crash ] %d kills, %llu acknowledged puts verified, %.1f s\n",
              kKills, static_cast<unsigned long long>(total_acked), secs);
}

}  // namespace
}  // namespace infoflow::store
