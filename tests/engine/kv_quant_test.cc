// Quantized chunk records (engine/chunk/kv_quant.h, chunk_codec.h): the
// per-element error bound of a section round trip, exactness at r = 1 with
// quantized records, and the fidelity gate on the shipped model: NONE and
// INFOFLOW r = 0.15 over int8 records stay within a small KL of the same
// method over raw records.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "cache_store/kv_record.h"
#include "engine/blend/pipeline.h"
#include "engine/chunk/chunk_codec.h"
#include "engine/chunk/kv_quant.h"
#include "engine/eval/eval_set.h"
#include "engine/chunk/chunk_prefill.h"
#include "engine/model/forward.h"
#include "engine/text/tokenizer.h"
#include "tests/engine/test_util.h"

namespace infoflow {
namespace {

using testing::MaxAbsDiff;

// Each element's error is at most half a step of its group:
// (group max - group min) / (2 * (2^bits - 1)).
void ExpectWithinHalfStep(const at::Tensor& x, const at::Tensor& back, const QuantSpec& spec) {
  at::Tensor xt = spec.axis == QuantAxis::kTokens ? x : x.transpose(1, 2);  // [H, N, M]
  at::Tensor bt = spec.axis == QuantAxis::kTokens ? back : back.transpose(1, 2);
  const int64_t n = xt.size(1);
  const double levels = (1 << spec.bits) - 1;
  for (int64_t g0 = 0; g0 < n; g0 += spec.group) {
    const int64_t len = std::min<int64_t>(spec.group, n - g0);
    at::Tensor xs = xt.narrow(1, g0, len).to(at::kDouble), bs = bt.narrow(1, g0, len).to(at::kDouble);
    at::Tensor half_step = (xs.amax(1) - xs.amin(1)) / (2 * levels);  // [H, M]
    at::Tensor excess = (xs - bs).abs() - half_step.unsqueeze(1) - 1e-6;
    ASSERT_LE(excess.max().item<double>(), 0) << "group at " << g0;
  }
}

TEST(KvQuant, SectionRoundTripIsWithinHalfAStepPerElement) {
  at::manual_seed(7);
  // 13 tokens and head_dim 6: partial groups on both axes; a constant channel.
  at::Tensor x = at::randn({2, 13, 6}) * 3 + 1;
  x.select(2, 4).fill_(0.5);
  for (int bits : {8, 4}) {
    for (QuantAxis axis : {QuantAxis::kTokens, QuantAxis::kDims}) {
      for (int group : {1, 4, 64}) {
        SCOPED_TRACE(std::to_string(bits) + " bits, group " + std::to_string(group));
        const QuantSpec spec{bits, group, axis};
        const size_t codes = (QuantCodeBytes(2, 13, 6, bits) + 3) / 4 * 4;
        const int64_t groups = axis == QuantAxis::kTokens ? 2 * ((13 + group - 1) / group) * 6
                                                          : 2 * ((6 + group - 1) / group) * 13;
        std::string buf(codes + groups * 8, '\0');
        QuantizeSection(x, spec, codes, buf.data());
        at::Tensor back = DequantizeSection(buf.data(), 2, 13, 6, spec, codes, at::kFloat);
        ASSERT_EQ(back.sizes(), x.sizes());
        ExpectWithinHalfStep(x, back, spec);
        // The constant channel comes back exactly when groups run along tokens.
        if (axis == QuantAxis::kTokens) {
          EXPECT_TRUE(at::allclose(back.select(2, 4), x.select(2, 4)));
        }
      }
    }
  }
}

// Through a stored record and back (ThroughRecord), checking on the way that
// the record's own key is the one the codec's lookups use.
std::shared_ptr<const ChunkKv> RoundTrip(const Model& model, const ChunkKv& kv, PrefixMode mode,
                                         const KvCodec& codec) {
  absl::StatusOr<std::string> bytes = EncodeChunkRecord(model, kv, mode, codec);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<store::KvRecord> rec = store::DecodeRecord(*bytes);
  EXPECT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->Key(), ChunkKeyFor(model, kv.token_ids, mode, codec));
  absl::StatusOr<std::shared_ptr<const ChunkKv>> back = ThroughRecord(model, kv, mode, codec);
  EXPECT_TRUE(back.ok()) << back.status();
  return back.ok() ? *back : nullptr;
}

TEST(KvQuant, CodecsAreDistinctRecordsAndSmaller) {
  std::unique_ptr<Model> model = testing::LoadOrDie(testing::GeneratedModelDir("llama"));
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> ids = {5, 9, 13, 200, 7, 42, 42, 3, 11};
  absl::StatusOr<ChunkKv> kv = PrefillChunk(*model, ids, PrefixMode::kBos);
  ASSERT_TRUE(kv.ok());
  const KvCodec raw, int8{KvCodec::Kind::kInt8, 64}, int4{KvCodec::Kind::kInt4, 64},
      int4_g32{KvCodec::Kind::kInt4, 32};
  std::vector<store::ChunkKey> keys;
  std::vector<size_t> sizes;
  for (const KvCodec& c : {raw, int8, int4, int4_g32}) {
    keys.push_back(ChunkKeyFor(*model, ids, PrefixMode::kBos, c));
    sizes.push_back(EncodeChunkRecord(*model, *kv, PrefixMode::kBos, c)->size());
    std::shared_ptr<const ChunkKv> back = RoundTrip(*model, *kv, PrefixMode::kBos, c);
    ASSERT_NE(back, nullptr);
    EXPECT_EQ(back->lossy, c.kind != KvCodec::Kind::kRaw);
    EXPECT_EQ(back->token_ids, ids);
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    for (size_t j = i + 1; j < keys.size(); ++j) EXPECT_NE(keys[i], keys[j]) << i << " " << j;
  }
  EXPECT_LT(sizes[1], sizes[0]);
  EXPECT_LT(sizes[2], sizes[1]);
  // The payload sizes follow KvBytesPerToken.
  EXPECT_DOUBLE_EQ(KvBytesPerToken(*model, raw),
                   2.0 * model->n_layers() * model->config().num_key_value_heads *
                       model->config().head_dim * 4);
  EXPECT_LT(KvBytesPerToken(*model, int8), KvBytesPerToken(*model, raw) / 3);
  EXPECT_LT(KvBytesPerToken(*model, int4), KvBytesPerToken(*model, raw) / 6);
}

// r = 1 with quantized records still equals FULL: recompute overwrites every
// context token, and a lossy first chunk is not skipped.
TEST(KvQuant, RatioOneEqualsFullWithQuantizedRecords) {
  std::unique_ptr<Model> model = testing::LoadOrDie(testing::GeneratedModelDir("qwen3"));
  ASSERT_NE(model, nullptr);
  const int32_t bos = static_cast<int32_t>(model->config().bos_token_id.value_or(1));
  for (KvCodec codec : {KvCodec{KvCodec::Kind::kInt8, 16}, KvCodec{KvCodec::Kind::kInt4, 16}}) {
    SCOPED_TRACE(KvCodecName(codec.kind));
    QueryInput in;
    in.prefix_ids = {bos};
    in.chunk_prefix_mode = PrefixMode::kBos;
    for (int c = 0; c < 3; ++c) {
      std::vector<int32_t> ids;
      for (int i = 0; i < 14 + 5 * c; ++i) ids.push_back(3 + (i * 37 + c * 101) % 400);
      absl::StatusOr<ChunkKv> kv = PrefillChunk(*model, ids, PrefixMode::kBos);
      ASSERT_TRUE(kv.ok());
      in.chunks.push_back(RoundTrip(*model, *kv, PrefixMode::kBos, codec));
    }
    in.question_ids = {17, 29, 31, 47};
    in.prompt_ids = in.question_ids;
    auto logits = [&](const MethodOptions& o) {
      absl::StatusOr<BlendedContext> ctx = BuildContext(*model, in, o);
      EXPECT_TRUE(ctx.ok()) << ctx.status();
      ForwardOptions all;
      all.logits = ForwardOptions::Logits::kAll;
      return PrefillTokens(*model, in.prompt_ids, ctx->next_position, &ctx->cache, all).logits;
    };
    MethodOptions full;
    full.method = Method::kFull;
    const at::Tensor ref = logits(full);
    for (Method m : {Method::kInfoFlow, Method::kCacheBlend, Method::kRandom,
                     Method::kCacheBlendPartial, Method::kInfoFlowBlend}) {
      MethodOptions o;
      o.method = m;
      o.ratio = 1.0;
      EXPECT_LE(MaxAbsDiff(logits(o), ref), 1e-4) << MethodName(m);
    }
    MethodOptions none;
    none.method = Method::kNone;
    EXPECT_GT(MaxAbsDiff(logits(none), ref), 1e-4);  // the records really are lossy
  }
}

// The fidelity gate: on the shipped model and the model card's split task
// (2K tokens), NONE and INFOFLOW r = 0.15 over int8 records answer like the
// same method over raw records.
TEST(KvQuant, Int8StaysWithinASmallKlOfRawOnTheShippedModel) {
  const std::string dir = std::string(INFOFLOW_SOURCE_DIR) + "/models/infoflow-tiny";
  std::unique_ptr<Model> model = testing::LoadOrDie(dir);
  ASSERT_NE(model, nullptr);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromFile(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EvalSetOptions eo;
  eo.n_examples = 6;
  eo.n_chunks = 8;
  eo.chunk_words = 220;
  eo.tasks = {"split"};
  const int32_t bos = static_cast<int32_t>(model->config().bos_token_id.value_or(1));
  // int8 is gated; int4 is measured and printed (docs/DESIGN.md §5 reports it).
  const KvCodec codecs[2] = {{KvCodec::Kind::kInt8, 64}, {KvCodec::Kind::kInt4, 64}};
  double worst[2][2] = {{0, 0}, {0, 0}}, sum[2][2] = {{0, 0}, {0, 0}};
  const std::vector<EvalExample> examples = GenerateEvalSet(eo);
  for (const EvalExample& ex : examples) {
    QueryInput raw, quant[2];
    raw.prefix_ids = {bos};
    raw.chunk_prefix_mode = PrefixMode::kBos;
    raw.question_ids = (*tok)->Encode(ex.question);
    raw.prompt_ids = (*tok)->Encode(
        absl::StrReplaceAll("\nQuestion: {question}\nAnswer:", {{"{question}", ex.question}}));
    quant[0] = quant[1] = raw;
    for (const std::string& text : ex.chunks) {
      absl::StatusOr<ChunkKv> kv = PrefillChunk(*model, (*tok)->Encode(text), PrefixMode::kBos);
      ASSERT_TRUE(kv.ok());
      for (int c = 0; c < 2; ++c) {
        quant[c].chunks.push_back(RoundTrip(*model, *kv, PrefixMode::kBos, codecs[c]));
      }
      raw.chunks.push_back(std::make_shared<ChunkKv>(*std::move(kv)));
    }
    for (int which = 0; which < 2; ++which) {
      MethodOptions o;
      o.method = which == 0 ? Method::kNone : Method::kInfoFlow;
      o.ratio = 0.15;
      // The answer's first token is always " "; teacher-force it and compare
      // the distributions at the first answer-content token (where KL says
      // something: at " " every method agrees to ~1e-9).
      auto answer_token = [&](const QueryInput& in, int32_t* first) {
        absl::StatusOr<BlendedContext> ctx = BuildContext(*model, in, o);
        EXPECT_TRUE(ctx.ok()) << ctx.status();
        const int64_t start = ctx->next_position;
        at::Tensor l = PrefillTokens(*model, in.prompt_ids, start, &ctx->cache).logits;
        if (*first < 0) *first = static_cast<int32_t>(l.argmax(-1).item<int64_t>());
        l = PrefillTokens(*model, {*first}, start + static_cast<int64_t>(in.prompt_ids.size()),
                          &ctx->cache)
                .logits;
        return at::log_softmax(l.to(at::kDouble), -1);
      };
      int32_t first = -1;
      const at::Tensor p = answer_token(raw, &first);
      for (int c = 0; c < 2; ++c) {
        const at::Tensor q = answer_token(quant[c], &first);
        const double kl = (p.exp() * (p - q)).sum().item<double>();
        worst[c][which] = std::max(worst[c][which], kl);
        sum[c][which] += kl;
      }
    }
  }
  for (int c = 0; c < 2; ++c) {
    std::printf("KL(raw || %s) at the first answer-content token over %zu split examples: NONE "
                "mean %.2e max %.2e; INFOFLOW r=0.15 mean %.2e max %.2e\n",
                KvCodecName(codecs[c].kind), examples.size(), sum[c][0] / examples.size(),
                worst[c][0], sum[c][1] / examples.size(), worst[c][1]);
  }
  // For scale: NONE vs FULL is ~6.6 and INFOFLOW vs FULL ~1.0 here (model card).
  EXPECT_LT(worst[0][0], 0.01);
  EXPECT_LT(worst[0][1], 0.01);
}

}  // namespace
}  // namespace infoflow
