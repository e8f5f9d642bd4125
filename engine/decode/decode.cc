#include "engine/decode/decode.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>

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

DecodeState::DecodeState(const DecodeOptions& options, const Tokenizer* tokenizer,
                         int64_t next_position, int64_t max_positions, TokenCallback on_token)
    : options_(options),
      sampler_(options.sampling),
      on_token_(std::move(on_token)),
      next_position_(next_position),
      max_positions_(max_positions) {
  if (tokenizer) stream_ = std::make_unique<StreamingDecoder>(tokenizer, /*skip_special=*/true);
  if (options_.max_new_tokens <= 0) Finish(StopReason::kMaxTokens);
}

DecodeState::~DecodeState() = default;

std::optional<NextToken> DecodeState::Advance(const at::Tensor& logits) {
  const std::vector<int32_t>& stop_ids = options_.stop_ids;
  int32_t id;
  if (generated() < options_.min_new_tokens && !stop_ids.empty()) {
    at::Tensor masked = logits.reshape({-1}).clone();
    if (!stop_index_.defined()) {
      std::vector<int64_t> in_vocab;
      for (int32_t s : stop_ids) {
        if (s >= 0 && s < masked.size(0)) in_vocab.push_back(s);
      }
      stop_index_ = at::tensor(in_vocab, at::kLong).to(masked.device());
    }
    masked.index_fill_(0, stop_index_, -std::numeric_limits<float>::infinity());
    id = sampler_.Sample(masked);
  } else {
    id = sampler_.Sample(logits);
  }
  if (std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) {
    Finish(StopReason::kStopId);
    return std::nullopt;
  }
  result_.ids.push_back(id);
  if (stream_) pending_ += stream_->Push(id);
  bool stop_string = false;
  for (const std::string& s : options_.stop_strings) {
    const size_t at = s.empty() ? std::string::npos : pending_.find(s);
    if (at != std::string::npos) {
      pending_.resize(at);
      stop_string = true;
    }
  }
  const size_t emit =
      stop_string ? pending_.size() : pending_.size() - HeldBack(pending_, options_.stop_strings);
  const std::string out = pending_.substr(0, emit);
  pending_.erase(0, emit);
  result_.text += out;
  if (on_token_ && !on_token_(id, out)) {
    Cancel();
    return std::nullopt;
  }
  if (stop_string) {  // ends without flushing: the stop string is not emitted
    result_.stop_reason = StopReason::kStopString;
    done_ = true;
    return std::nullopt;
  }
  if (generated() == options_.max_new_tokens) {
    Finish(StopReason::kMaxTokens);
    return std::nullopt;
  }
  if (max_positions_ > 0 && next_position_ >= max_positions_) {
    Finish(StopReason::kContextFull);
    return std::nullopt;
  }
  return NextToken{id, next_position_++};
}

void DecodeState::Cancel() {
  result_.stop_reason = StopReason::kCancelled;
  done_ = true;
}

void DecodeState::Finish(StopReason reason) {
  result_.stop_reason = reason;
  done_ = true;
  if (stream_) pending_ += stream_->Flush();
  result_.text += pending_;
  if (on_token_ && !pending_.empty()) on_token_(-1, pending_);
  pending_.clear();
}

DecodeResult Decode(const Model& model, KvCache* cache, int64_t next_position,
                    const at::Tensor& logits_in, const DecodeOptions& options,
                    const Tokenizer* tokenizer, const TokenCallback& on_token) {
  DecodeState state(options, tokenizer, next_position, model.config().max_position_embeddings,
                    on_token);
  at::Tensor logits = logits_in;
  while (!state.done()) {
    std::optional<NextToken> next = state.Advance(logits);
    if (!next) break;
    logits = PrefillTokens(model, {next->id}, next->position, cache).logits;
  }
  return state.TakeResult();
}

}  // namespace infoflow
