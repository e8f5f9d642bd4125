// Process-wide allocator setting for processes that move many multi-MiB KV
// records (the server, store_bench).
//
// Why: glibc serves allocations above M_MMAP_THRESHOLD with fresh mmap()s
// and trims freed heap tops above M_TRIM_THRESHOLD, so every 1 MiB record
// read from disk lands in pages the kernel must fault in again. On the
// dev VMs a page fault is so expensive that store_bench's RocksDB read path
// dropped from ~2 GB/s to ~50 MB/s. Raising both thresholds lets freed
// record buffers be reused without faults, at the cost of the process
// returning freed memory to the OS less eagerly.
//
// Call once, early in main(), before other threads start. It changes global
// malloc behaviour, which is why the library never calls it by itself.
#ifndef INFOFLOW_CACHE_STORE_MALLOC_TUNING_H_
#define INFOFLOW_CACHE_STORE_MALLOC_TUNING_H_

namespace infoflow::store {

// Returns false if the C library rejected the setting (non-glibc builds are
// a no-op returning false).
bool TuneMallocForLargeValues();

}  // namespace infoflow::store

#endif  // INFOFLOW_CACHE_STORE_MALLOC_TUNING_H_
