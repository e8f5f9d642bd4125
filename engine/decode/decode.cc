#include "engine/decode/decode.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "engine/model/forward.h"
#include "engine/text/tokenizer.h"

namespace infoflow {
namespace {

// Length of the longest suffix of `text` that is a proper prefix of some stop
// string: that much must be held back until the next token decides.
size_t HeldBack(std::string_view text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& s : stops) {
    for (size_t n = std::min(s.size() - 1, text.size()); n > hold; --n) {
      if (text.substr(text.size() - n) == std::string_view(s).substr(0, n)) {
        hold = n;
        break;
      }
    }
  }
  return hold;
}

}  // namespace

const char* StopReasonName(StopReason r) {
  switch (r) {
    case StopReason::kMaxTokens: return "max_tokens";
    case StopReason::kStopId: return "stop_id";
    case StopReason::kStopString: return "stop_string";
    case StopReason::kCancelled: return "cancelled";
    case StopReason::kContextFull: return "context_full";
  }
  return "unknown";
}

DecodeResult Decode(const Model& model, KvCache* cache, int64_t next_position,
                    const at::Tensor& logits_in, const DecodeOptions& options,
                    const Tokenizer* tokenizer, const TokenCallback& on_token) {
  DecodeResult result;
  Sampler sampler(options.sampling);
  std::unique_ptr<StreamingDecoder> stream;
  if (tokenizer) stream = std::make_unique<StreamingDecoder>(tokenizer, /*skip_special=*/true);
  std::string pending;  // decoded text not yet handed to on_token
  at::Tensor logits = logits_in;
  const int64_t max_pos = model.config().max_position_embeddings;

  for (int i = 0; i < options.max_new_tokens; ++i) {
    const int32_t id = sampler.Sample(logits);
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), id) != options.stop_ids.end()) {
      result.stop_reason = StopReason::kStopId;
      break;
    }
    result.ids.push_back(id);
    if (stream) pending += stream->Push(id);
    bool stop_string = false;
    for (const std::string& s : options.stop_strings) {
      const size_t at = s.empty() ? std::string::npos : pending.find(s);
      if (at != std::string::npos) {
        pending.resize(at);
        stop_string = true;
      }
    }
    const size_t emit = stop_string ? pending.size() : pending.size() - HeldBack(pending, options.stop_strings);
    const std::string out = pending.substr(0, emit);
    pending.erase(0, emit);
    result.text += out;
    if (on_token && !on_token(id, out)) {
      result.stop_reason = StopReason::kCancelled;
      return result;
    }
    if (stop_string) {
      result.stop_reason = StopReason::kStopString;
      return result;
    }
    if (i + 1 == options.max_new_tokens) break;
    if (max_pos > 0 && next_position >= max_pos) {
      result.stop_reason = StopReason::kContextFull;
      break;
    }
    logits = PrefillTokens(model, {id}, next_position++, cache).logits;
  }
  if (stream) pending += stream->Flush();
  result.text += pending;
  if (on_token && !pending.empty()) on_token(-1, pending);
  return result;
}

}  // namespace infoflow
