// The store's own background threads (the shared tier's local fill and its
// write-behind) run at the lowest CPU priority: they are never on a query's
// path, and on a small machine a query's math must not share its cores with
// them (measured on 2 cores: a query whose chunks came from the cluster ran
// alongside the 48 MiB of local writes it had queued).
#ifndef INFOFLOW_CACHE_STORE_BACKGROUND_PRIORITY_H_
#define INFOFLOW_CACHE_STORE_BACKGROUND_PRIORITY_H_

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace infoflow::store {

// Lowers the calling thread (not the process) to nice 19. Best effort: a
// failure (no permission to change it) only costs speed.
inline void LowerThisThreadPriority() {
#if defined(__linux__)
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
#endif
}

}  // namespace infoflow::store

#endif  // INFOFLOW_CACHE_STORE_BACKGROUND_PRIORITY_H_
