// Spawned by StoreCrashTest: opens the store at argv[1] with durable Puts
// and writes records MakeRecord(seed) for seed = argv[2], argv[2] + 1, ...
// forever. After each acknowledged Put it writes the seed (8 bytes, host
// order) to stdout, so the parent knows exactly which Puts returned OK
// before it sends SIGKILL.
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cache_store/chunk_store.h"
#include "tests/store/test_records.h"

namespace {

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using infoflow::store::ChunkStore;
  using infoflow::store::ChunkStoreOptions;
  using infoflow::store::testing::MakeRecord;
  using infoflow::store::testing::RecordShape;
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s DB_DIR FIRST_SEED\n", argv[0]);
    return 2;
  }
  ChunkStoreOptions o;
  o.path = argv[1];
  o.sync = true;
  o.ram_tier_bytes = 0;
  auto store = ChunkStore::Open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", store.status().ToString().c_str());
    return 1;
  }
  uint64_t seed = std::strtoull(argv[2], nullptr, 10);
  for (;; ++seed) {
    // Alternate inline-sized and blob-sized records.
    RecordShape shape;
    if (seed % 2 == 1) {
      shape.n_kv_heads = 4;
      shape.head_dim = 64;
      shape.n_tokens = 64;  // 128 KiB payload
    }
    const auto rec = MakeRecord(seed, shape);
    auto put = (*store)->Put(rec.key, rec.bytes);
    if (!put.ok()) {
      std::fprintf(stderr, "put: %s\n", put.status().ToString().c_str());
      return 1;
    }
    if (!WriteAll(STDOUT_FILENO, &seed, sizeof(seed))) return 1;
  }
}
