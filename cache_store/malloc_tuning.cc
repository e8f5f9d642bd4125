#include "cache_store/malloc_tuning.h"

#include <cstddef>  // defines __GLIBC__ (via <features.h>) for the test below

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace infoflow::store {

bool TuneMallocForLargeValues() {
#if defined(__GLIBC__)
  // 32 MiB is glibc's ceiling for the mmap threshold on 64-bit; records up
  // to that size then come from the (reusable) heap.
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return mmap_ok && trim_ok;
#else
  return false;
#endif
}

}  // namespace infoflow::store
