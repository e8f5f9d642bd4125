// RecordBuffers: the byte buffers of chunk records read from the shared
// tier, recycled between reads.
//
// Why: a record fetched from the Redis Cluster is megabytes of fresh heap.
// Between queries the heap's free memory is taken by other work (the local
// fill's RocksDB memtable and write batches) or handed back to the OS by
// the server's idle trim, so every fetch faulted its records in again and
// zero-filled them first: 8 records of 6 MiB faulted 52 MiB on a warm
// server, and the fetch took 68 ms against 10 ms for the same records from
// RocksDB (remote_bench). The cluster reader (redis_cluster.cc) reads a
// large value into a buffer from Take(); the record made from it
// (ChunkValue::CreateRecycling) hands it back with Give() when its last
// reader lets go. A kept buffer is allocated memory, so malloc_trim leaves
// it resident, and Take() hands it out without zeroing. Now: 23 ms, 2 MiB.
//
// RocksDB reads do not use it: RocksDB returns blob values pinned in read
// buffers of its own, and keeping our copies here instead of freeing them
// took the heap memory those buffers had been reusing (a warm RocksDB hit
// went from 10 to 150-230 ms, 44-50 MiB of faults; bench_out/final/remote6).
//
// Thread-safe; one process-wide instance (Default). Bounded in bytes
// (set_retain_bytes, the server's --record-buffer-retain-mb); Trim returns
// what the caller chooses (the server's long-idle release empties it).
#ifndef INFOFLOW_CACHE_STORE_RECORD_BUFFERS_H_
#define INFOFLOW_CACHE_STORE_RECORD_BUFFERS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace infoflow::store {

struct RecordBufferStats {
  uint64_t reused = 0, reused_bytes = 0;  // Take served from a kept buffer
  uint64_t fresh = 0, fresh_bytes = 0;    // Take allocated (and zero-filled) anew
  size_t cached_bytes = 0;                // kept, waiting for a Take
  size_t cached_buffers = 0;
};

class RecordBuffers {
 public:
  // Buffers smaller than this are neither kept nor looked up: small values
  // are cheap to allocate and would only fragment the cache.
  static constexpr size_t kMinBytes = size_t{256} << 10;
  // Default budget of kept buffers (set_retain_bytes changes it).
  static constexpr size_t kDefaultRetainBytes = size_t{512} << 20;

  // The process's instance (never destroyed: records may be released by
  // static destructors after any other).
  static RecordBuffers& Default();

  explicit RecordBuffers(size_t retain_bytes = kDefaultRetainBytes);
  RecordBuffers(const RecordBuffers&) = delete;
  RecordBuffers& operator=(const RecordBuffers&) = delete;

  // A string of exactly `n` bytes. Its contents are unspecified when it
  // comes from a kept buffer (the caller overwrites them); a new one is
  // zero-filled. A kept buffer is used when its capacity is within [n,
  // n + n/4]; the smallest such.
  std::string Take(size_t n);

  // Hands back a buffer nobody reads any more. Kept when its capacity is at
  // least kMinBytes and the kept bytes stay within the budget; freed
  // otherwise. Its contents are not looked at.
  void Give(std::string&& buffer);

  // Frees kept buffers, largest first, until at most `keep_bytes` stay.
  // Returns the bytes freed.
  size_t Trim(size_t keep_bytes);

  void set_retain_bytes(size_t bytes);  // frees what is over it now
  RecordBufferStats stats() const;

 private:
  size_t TrimLocked(size_t keep_bytes);

  mutable std::mutex mu_;
  size_t retain_bytes_;                      // guarded by mu_
  std::multimap<size_t, std::string> kept_;  // capacity -> buffer; guarded by mu_
  RecordBufferStats stats_;                  // guarded by mu_
};

}  // namespace infoflow::store

#endif  // INFOFLOW_CACHE_STORE_RECORD_BUFFERS_H_
