// The generation loop: sample, stream, stop.
#ifndef INFOFLOW_ENGINE_DECODE_DECODE_H_
#define INFOFLOW_ENGINE_DECODE_DECODE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "engine/decode/sampler.h"

namespace infoflow {

class Tokenizer;

struct DecodeOptions {
  SamplingParams sampling;
  int max_new_tokens = 64;
  std::vector<int32_t> stop_ids;          // generation ends after emitting none of these
  std::vector<std::string> stop_strings;  // ends when the text contains one (not emitted)
};

enum class StopReason { kMaxTokens, kStopId, kStopString, kCancelled, kContextFull };
const char* StopReasonName(StopReason r);

struct DecodeResult {
  std::vector<int32_t> ids;  // generated ids, stop id excluded
  std::string text;          // their text (empty without a tokenizer)
  StopReason stop_reason = StopReason::kMaxTokens;
};

// Called once per generated token with its id and the text that became
// printable with it (possibly empty: half a UTF-8 character, or text held
// back because it may begin a stop string). Return false to cancel.
using TokenCallback = std::function<bool(int32_t id, std::string_view text)>;

// Generates after a prefill whose last-position logits are `logits`; the
// next token goes to position `next_position`, appended to `cache`. The
// tokenizer may be null (ids only; stop strings then never match).
DecodeResult Decode(const Model& model, KvCache* cache, int64_t next_position,
                    const at::Tensor& logits, const DecodeOptions& options,
                    const Tokenizer* tokenizer, const TokenCallback& on_token);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_DECODE_DECODE_H_
