// GroupStore: the control plane of a sequence-parallel server group, a
// c10d TCPStore (a small key-value server with atomic counters) that rank 0
// hosts for the life of its process and every other rank connects to.
// What goes through it is small and rare: the group's generation, each
// rank's "ready" mark, heartbeats and one command per query. The data
// (K/V blocks, scores, records) go through the SequenceParallelGroup that
// each generation builds on the same store (GroupOptions::use_existing_store).
//
// Every failure is a status, never an exception: UNAVAILABLE naming the
// store's address. Thread-safe (the c10d client serializes its operations).
#ifndef INFOFLOW_ENGINE_DIST_GROUP_STORE_H_
#define INFOFLOW_ENGINE_DIST_GROUP_STORE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace infoflow {

class GroupStore {
 public:
  // serve = true (rank 0): binds host:port (port 0 = an ephemeral port) and
  // serves until the object is destroyed. serve = false: connects to the
  // store at host:port, retrying until `timeout` passes. `timeout` also
  // bounds every later operation.
  static absl::StatusOr<std::unique_ptr<GroupStore>> Open(const std::string& host, int port,
                                                          bool serve,
                                                          std::chrono::milliseconds timeout);
  ~GroupStore();
  GroupStore(const GroupStore&) = delete;
  GroupStore& operator=(const GroupStore&) = delete;

  const std::string& host() const { return host_; }
  int port() const { return port_; }

  absl::Status Set(const std::string& key, const std::string& value);
  // The value, or nullopt when the key is not set. Never blocks on a
  // missing key.
  absl::StatusOr<std::optional<std::string>> Get(const std::string& key);
  // Adds `delta` to the counter `key` (0 when unset) and returns the sum.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  absl::StatusOr<bool> Contains(const std::string& key);
  absl::Status Delete(const std::string& key);

 private:
  struct Impl;
  GroupStore(std::unique_ptr<Impl> impl, std::string host, int port);
  absl::Status Failed(const char* what, const std::string& key, const std::exception& e) const;

  std::unique_ptr<Impl> impl_;
  std::string host_;
  int port_ = 0;
};

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_DIST_GROUP_STORE_H_
