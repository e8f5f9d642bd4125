// ShareChunks: the fetch stage of a sequence-parallel query (docs/DESIGN.md
// §16, "Server group mode"). Every rank of the group calls it with the same
// layout and keys; afterwards each holds the K/V of its own chunks only.
//
// Rank 0 has resolved every chunk already (ChunkResolver: stored, fetched or
// prefilled now), so its store is the group's store of record. Every other
// rank looks its chunks up in its own store (RAM, RocksDB, then the shared
// Redis tier when configured); the ones it lacks it receives from rank 0 as
// the encoded records, exactly as stored, verifies them like a disk read and
// keeps them in its store, so the next query finds them locally. Records are
// sent only when some rank lacks one (all ranks learn that first), so a
// warm group exchanges a few bytes here.
#ifndef INFOFLOW_SERVER_GROUP_SHARD_CHUNKS_H_
#define INFOFLOW_SERVER_GROUP_SHARD_CHUNKS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/dist/sp_pipeline.h"

namespace infoflow {
namespace store {
class ChunkStore;
}

namespace server {

struct SharedShard {
  // This rank's chunks (layout.chunk_begin..chunk_end of its rank), request
  // order. Null where no intact record could be had (rank 0 could not read
  // its own copy, or it did not verify): RunShardedQuery then refuses the
  // query on every rank at once.
  std::vector<std::shared_ptr<const ChunkKv>> local;
  int from_store = 0;                 // found in this rank's store (RAM, disk, shared tier)
  int from_rank0 = 0;                 // received from rank 0
  int64_t record_bytes_sent = 0;      // by rank 0
  int64_t record_bytes_received = 0;  // by this rank
};

// `all` (rank 0 only, null elsewhere): every chunk's KV in request order.
// UNAVAILABLE naming the rank when an exchange fails; every local problem
// is a null entry instead, so the ranks stay in step.
absl::StatusOr<SharedShard> ShareChunks(SequenceParallelGroup* group, const Model& model,
                                        store::ChunkStore* store, const ShardLayout& layout,
                                        const std::vector<std::string>& keys_hex, PrefixMode mode,
                                        const std::vector<std::shared_ptr<const ChunkKv>>* all);

}  // namespace server
}  // namespace infoflow

#endif  // INFOFLOW_SERVER_GROUP_SHARD_CHUNKS_H_
