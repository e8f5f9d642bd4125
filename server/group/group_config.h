// Where a server process sits in a sequence-parallel group (the --world-size,
// --rank, --dist-init, --dist-timeout-ms and --dist-interface flags).
#ifndef INFOFLOW_SERVER_GROUP_GROUP_CONFIG_H_
#define INFOFLOW_SERVER_GROUP_GROUP_CONFIG_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "engine/dist/sp_group.h"

namespace infoflow::server {

struct GroupConfig {
  int world_size = 1;
  int rank = 0;
  std::string host = "127.0.0.1";  // rank 0's control-store address
  int port = 29500;                // rank 0 binds it (0 = ephemeral, tests)
  // An exchange, a heartbeat or a store operation that makes no progress
  // for this long fails; a rank silent this long is declared lost.
  std::chrono::milliseconds timeout{30000};
  // Network interface for Gloo's data connections; "" = the address that
  // `host` routes from when it is loopback, else the machine's hostname.
  std::string interface;
  // Data plane: "gloo", or "nccl" (CUDA builds; ranks on GPUs).
  std::string backend = "gloo";
  std::string device = "cpu";  // this rank's model device ("cuda:1")
};

// Control-store keys, one place for both sides of the protocol.
namespace group_keys {
inline std::string Generation() { return "generation"; }
inline std::string Ready(int64_t gen, int rank) {
  return "g" + std::to_string(gen) + "/ready/" + std::to_string(rank);
}
inline std::string Go(int64_t gen) { return "g" + std::to_string(gen) + "/go"; }
inline std::string GroupPrefix(int64_t gen) { return "g" + std::to_string(gen) + "/pg/"; }
inline std::string Command(int64_t gen, int64_t seq) {
  return "g" + std::to_string(gen) + "/cmd/" + std::to_string(seq);
}
inline std::string Heartbeat(int rank) { return "hb/" + std::to_string(rank); }
}  // namespace group_keys

// The Gloo/NCCL group of generation `gen` for this rank: built on rank 0's
// control store (already serving) under the generation's own key prefix.
inline GroupOptions GroupOptionsFor(const GroupConfig& c, int64_t gen) {
  GroupOptions o;
  o.host = c.host;
  o.port = c.port;
  o.rank = c.rank;
  o.world_size = c.world_size;
  o.timeout = c.timeout;
  o.use_existing_store = true;
  o.key_prefix = group_keys::GroupPrefix(gen);
  o.interface = c.interface;
  o.backend = c.backend;
  o.device = c.device;
  return o;
}

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_GROUP_GROUP_CONFIG_H_
