// The generation loop: sample, stream, stop.
//
// DecodeState is one generation's sampling and stopping logic (sampler,
// streaming detokenizer, stop ids, stop strings with held-back text, max
// tokens, context limit, cancel), advanced one token at a time from that
// request's next-token logits. Decode() drives it with Model::Forward for one
// request; a serving loop drives many with Model::DecodeStep. Both share this
// one implementation.
#ifndef INFOFLOW_ENGINE_DECODE_DECODE_H_
#define INFOFLOW_ENGINE_DECODE_DECODE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "engine/decode/sampler.h"

namespace infoflow {

class StreamingDecoder;
class Tokenizer;

struct DecodeOptions {
  SamplingParams sampling;
  int max_new_tokens = 64;
  // Before this many tokens the stop ids are masked out of the logits (they
  // cannot be sampled); stop strings still end generation.
  int min_new_tokens = 0;
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

// A token to run through the model next: `id` at `position`.
struct NextToken {
  int32_t id = 0;
  int64_t position = 0;
};

// Not thread-safe: one owner at a time (it may be handed between threads).
class DecodeState {
 public:
  // The first token comes from the prefill's last logits and goes to
  // `next_position`. `max_positions` (the model's max_position_embeddings;
  // 0 = unbounded) ends generation with kContextFull. The tokenizer may be
  // null (ids only; stop strings then never match); it and `on_token` must
  // outlive the state.
  DecodeState(const DecodeOptions& options, const Tokenizer* tokenizer, int64_t next_position,
              int64_t max_positions, TokenCallback on_token);
  ~DecodeState();
  DecodeState(const DecodeState&) = delete;
  DecodeState& operator=(const DecodeState&) = delete;

  // Samples the next token from `logits` ([vocab] or [1, vocab]), streams
  // its text to on_token and checks every stop condition. Returns the token
  // the caller must run through the model (writing its K/V) to get the
  // logits for the following call, or nullopt once generation has ended
  // (then result() is final). Must not be called after done().
  std::optional<NextToken> Advance(const at::Tensor& logits);

  // Ends generation now with kCancelled (the client went away); nothing
  // more is streamed.
  void Cancel();

  bool done() const { return done_; }
  int generated() const { return static_cast<int>(result_.ids.size()); }
  const DecodeResult& result() const { return result_; }
  DecodeResult TakeResult() { return std::move(result_); }

 private:
  // Flushes held-back text (normal ends; not cancel or stop string).
  void Finish(StopReason reason);

  const DecodeOptions options_;
  Sampler sampler_;
  std::unique_ptr<StreamingDecoder> stream_;
  TokenCallback on_token_;
  std::string pending_;  // decoded text not yet handed to on_token
  // The in-vocabulary stop ids as one index tensor, built at the first token
  // that must mask them (min_new_tokens): one index_fill per token instead
  // of one tensor write per id.
  at::Tensor stop_index_;
  int64_t next_position_;
  const int64_t max_positions_;
  DecodeResult result_;
  bool done_ = false;
};

// Generates after a prefill whose last-position logits are `logits`; the
// next token goes to position `next_position`, appended to `cache`. The
// tokenizer may be null (ids only; stop strings then never match).
DecodeResult Decode(const Model& model, KvCache* cache, int64_t next_position,
                    const at::Tensor& logits, const DecodeOptions& options,
                    const Tokenizer* tokenizer, const TokenCallback& on_token);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_DECODE_DECODE_H_
