// A query between its two phases: after the prefill (context built, prompt
// prefilled), before decoding. Produced by QueryRunner::Prefill, decoded
// either alone (QueryRunner::Run) or in the scheduler's batch. Only .cc files
// include this (it pulls in ATen); server headers stay torch-free.
#ifndef INFOFLOW_SERVER_PREFILLED_QUERY_H_
#define INFOFLOW_SERVER_PREFILLED_QUERY_H_

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>

#include "engine/decode/decode.h"
#include "engine/model/kv_cache.h"
#include "server/query_runner.h"

namespace infoflow::server {

struct PrefilledQuery {
  std::chrono::steady_clock::time_point start;        // Prefill's start (TTFT origin)
  std::chrono::steady_clock::time_point prompt_done;  // prompt prefilled
  QueryOutcome outcome;  // the prefill's part; FinishOutcome adds the decode's
  std::unique_ptr<KvCache> cache;
  at::Tensor logits;          // [1, vocab] at the last prompt position
  int64_t next_position = 0;  // where the first generated token goes
  DecodeOptions decode;
};

// Records the first token's time (call when the first token is streamed).
void MarkFirstToken(PrefilledQuery* q);
// Fills the decode part of q->outcome from `result`.
void FinishOutcome(PrefilledQuery* q, const DecodeResult& result);

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_PREFILLED_QUERY_H_
