// GroupCommand: what rank 0 tells every other rank of a sequence-parallel
// group about one query (docs/DESIGN.md §16, "Server group mode"): the
// method and its knobs, the token ids every rank needs (prefix, question,
// prompt: small), each chunk's key and length, and how many tokens will be
// decoded. The K/V never travel here: each rank fetches its own chunks from
// its store (server/group/shard_chunks.h).
//
// Encoded as JSON so a command in the control store can be read by a person
// debugging a group. Decoding checks every field's type and range: a
// command is trusted input from rank 0, but a mismatch (another build of the
// server on one rank) must fail the query, not the process.
#ifndef INFOFLOW_SERVER_GROUP_GROUP_COMMAND_H_
#define INFOFLOW_SERVER_GROUP_GROUP_COMMAND_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/blend/method.h"
#include "engine/chunk/chunk_prefill.h"
#include "engine/dist/sp_pipeline.h"

namespace infoflow::server {

struct GroupCommand {
  int64_t seq = 0;  // 0, 1, 2, ... within one generation of the group
  MethodOptions options;
  int max_new_tokens = 0;
  PrefixMode chunk_prefix_mode = PrefixMode::kBos;
  bool first_chunk_lossy = false;
  std::vector<int32_t> prefix_ids, question_ids, prompt_ids;
  std::vector<int64_t> chunk_lengths;   // request order
  std::vector<std::string> chunk_keys;  // 64 hex digits each, request order
};

std::string EncodeGroupCommand(const GroupCommand& c);

// The engine's input on one rank: the command's ids and lengths and the
// rank's own chunks (ShareChunks). Rank 0 adds the prefix's KV.
ShardedQueryInput ShardedInputFor(const GroupCommand& c,
                                  std::vector<std::shared_ptr<const ChunkKv>> local);
// InvalidArgument naming the field that is missing or malformed.
absl::StatusOr<GroupCommand> DecodeGroupCommand(std::string_view json);

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_GROUP_GROUP_COMMAND_H_
