// IdleTrimmer::HeapTrimmableBytes, the measure behind the idle trim's gate
// (--idle-trim-min-free-mb): freed heap counts until a trim hands it back,
// then no longer, and counts again once a later burst has touched it.
#include "server/idle_trimmer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace infoflow::server {
namespace {

#if defined(__GLIBC__)
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kPiece = size_t{64} << 10;  // below the mmap threshold: heap memory

// Allocates `bytes` in heap pieces, touches every page, then frees them all.
// The first call keeps its last piece as `fence`: it holds the freed range
// inside the heap rather than at its top, as a query's freed buffers usually
// are (glibc would otherwise shrink the top at once).
void TouchAndFree(size_t bytes, void** fence) {
  std::vector<void*> pieces;
  for (size_t done = 0; done < bytes; done += kPiece) {
    void* p = std::malloc(kPiece);
    ASSERT_NE(p, nullptr);
    std::memset(p, 1, kPiece);
    pieces.push_back(p);
  }
  if (*fence == nullptr) {  // the last piece, right above the others
    *fence = pieces.back();
    pieces.pop_back();
  }
  for (void* p : pieces) std::free(p);
}

// Whether all of glibc's heap memory is in the main arena ([heap]), which
// HeapTrimmableBytes reads page by page; with other arenas holding memory it
// falls back to fordblks. The server keeps one arena (server/main.cc).
bool OnlyTheMainArena() {
  size_t heap = 0;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("[heap]") == std::string::npos) continue;
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2) heap = hi - lo;
    break;
  }
  return heap > 0 && mallinfo2().arena <= heap + (size_t{1} << 20);
}

TEST(IdleTrimmerTest, TrimmedHeapIsNotCountedAgainUntilTouched) {
  // ctest runs this test alone in its process. Run with the whole binary,
  // after tests whose servers' threads made arenas of their own, the exact
  // measure does not apply.
  if (!OnlyTheMainArena()) GTEST_SKIP() << "other malloc arenas hold memory (run it alone)";
  // As the server runs: freed memory stays in the heap until trimmed.
  ASSERT_EQ(mallopt(M_TRIM_THRESHOLD, 1 << 30), 1);
  ASSERT_EQ(mallopt(M_MMAP_THRESHOLD, 32 << 20), 1);
  void* fence = nullptr;
  TouchAndFree(96 * kMiB, &fence);
  EXPECT_GE(IdleTrimmer::HeapTrimmableBytes(), 80 * kMiB);

  malloc_trim(0);
  // glibc still counts the returned pages as free...
  EXPECT_GE(mallinfo2().fordblks, 80 * kMiB);
  // ...but they are not resident, so there is nothing left to trim.
  EXPECT_LT(IdleTrimmer::HeapTrimmableBytes(), 16 * kMiB);

  // A later burst faults the same free range in again: it counts again.
  TouchAndFree(96 * kMiB, &fence);
  EXPECT_GE(IdleTrimmer::HeapTrimmableBytes(), 80 * kMiB);
  malloc_trim(0);
  EXPECT_LT(IdleTrimmer::HeapTrimmableBytes(), 16 * kMiB);
  std::free(fence);
}
#endif

}  // namespace
}  // namespace infoflow::server
