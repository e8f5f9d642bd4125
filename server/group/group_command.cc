#include "server/group/group_command.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace infoflow::server {
namespace {

using nlohmann::json;

template <typename T>
absl::Status Read(const json& j, const char* field, T* out) {
  auto it = j.find(field);
  if (it == j.end()) return absl::InvalidArgumentError(absl::StrCat("group command: no ", field));
  try {
    *out = it->get<T>();
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("group command: ", field, " has the wrong type: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace

std::string EncodeGroupCommand(const GroupCommand& c) {
  const MethodOptions& o = c.options;
  json j = {
      {"seq", c.seq},
      {"method", static_cast<int>(o.method)},
      {"ratio", o.ratio},
      {"reorder", o.reorder},
      {"scoring_layers", o.scoring_layers},
      {"variant", static_cast<int>(o.variant)},
      {"deviation", static_cast<int>(o.deviation)},
      {"stale_share", o.stale_share},
      {"probe_factor", o.probe_factor},
      {"lego_k", o.lego_k},
      {"seed", o.seed},
      {"max_new_tokens", c.max_new_tokens},
      {"chunk_prefix_mode", static_cast<int>(c.chunk_prefix_mode)},
      {"first_chunk_lossy", c.first_chunk_lossy},
      {"prefix_ids", c.prefix_ids},
      {"question_ids", c.question_ids},
      {"prompt_ids", c.prompt_ids},
      {"chunk_lengths", c.chunk_lengths},
      {"chunk_keys", c.chunk_keys},
  };
  return j.dump();
}

ShardedQueryInput ShardedInputFor(const GroupCommand& c,
                                  std::vector<std::shared_ptr<const ChunkKv>> local) {
  ShardedQueryInput in;
  in.prefix_ids = c.prefix_ids;
  in.chunk_lengths = c.chunk_lengths;
  in.local_chunks = std::move(local);
  in.chunk_prefix_mode = c.chunk_prefix_mode;
  in.first_chunk_lossy = c.first_chunk_lossy;
  in.question_ids = c.question_ids;
  in.prompt_ids = c.prompt_ids;
  return in;
}

absl::StatusOr<GroupCommand> DecodeGroupCommand(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("group command: not a JSON object");
  }
  GroupCommand c;
  MethodOptions& o = c.options;
  int method = 0, variant = 0, deviation = 0, mode = 0;
  absl::Status s;
  auto read = [&](const char* f, auto* out) {
    if (s.ok()) s = Read(j, f, out);
  };
  read("seq", &c.seq);
  read("method", &method);
  read("ratio", &o.ratio);
  read("reorder", &o.reorder);
  read("scoring_layers", &o.scoring_layers);
  read("variant", &variant);
  read("deviation", &deviation);
  read("stale_share", &o.stale_share);
  read("probe_factor", &o.probe_factor);
  read("lego_k", &o.lego_k);
  read("seed", &o.seed);
  read("max_new_tokens", &c.max_new_tokens);
  read("chunk_prefix_mode", &mode);
  read("first_chunk_lossy", &c.first_chunk_lossy);
  read("prefix_ids", &c.prefix_ids);
  read("question_ids", &c.question_ids);
  read("prompt_ids", &c.prompt_ids);
  read("chunk_lengths", &c.chunk_lengths);
  read("chunk_keys", &c.chunk_keys);
  if (!s.ok()) return s;
  if (method < 0 || method > static_cast<int>(Method::kInfoFlowBlend)) {
    return absl::InvalidArgumentError(absl::StrCat("group command: method ", method));
  }
  if (variant < 0 || variant > static_cast<int>(ScoreVariant::kVNorm) || deviation < 0 ||
      deviation > static_cast<int>(Deviation::kK) || (mode != 0 && mode != 1)) {
    return absl::InvalidArgumentError("group command: variant, deviation or prefix mode");
  }
  if (c.chunk_keys.size() != c.chunk_lengths.size()) {
    return absl::InvalidArgumentError("group command: chunk_keys and chunk_lengths differ");
  }
  o.method = static_cast<Method>(method);
  o.variant = static_cast<ScoreVariant>(variant);
  o.deviation = static_cast<Deviation>(deviation);
  c.chunk_prefix_mode = static_cast<PrefixMode>(mode);
  return c;
}

}  // namespace infoflow::server
