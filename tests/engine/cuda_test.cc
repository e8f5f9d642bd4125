// The engine on a CUDA device, pinned the way the CPU tests pin it
// (tests/engine/infoflow_test.cc): at ratio 1 every method equals FULL
// prefill, and the GPU agrees with the CPU on logits, on which tokens a
// method recomputes, and on a chunk record's round trip. Skipped where this
// libtorch has no CUDA or no GPU is visible (every CI run);
// deploy/gpu-engine-check.sh runs them on a GPU. INFOFLOW_CUDA_TEST_DEVICE
// names the device under test (default "cuda"; "cpu" dry-runs the tests'
// own logic on a machine without a GPU).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/blend/pipeline.h"
#include "engine/chunk/chunk_codec.h"
#include "engine/chunk/chunk_prefill.h"
#include "engine/model/forward.h"
#include "engine/model/model.h"
#include "tests/engine/test_util.h"

namespace infoflow {
namespace {

using testing::Ids;
using testing::MaxAbsDiff;

std::unique_ptr<Model> LoadOn(const std::string& dir, const std::string& device) {
  LoadOptions options;
  options.device = device;
  options.dtype = "f32";  // the CPU tests' dtype: differences are rounding only
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir, options);
  if (!m.ok()) {
    ADD_FAILURE() << "loading " << dir << " on " << device << ": " << m.status();
    return nullptr;
  }
  return *std::move(m);
}

std::string DeviceUnderTest() {
  const char* d = std::getenv("INFOFLOW_CUDA_TEST_DEVICE");
  return d != nullptr && *d != '\0' ? d : "cuda";
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string device = DeviceUnderTest();
    if (device != "cpu" && !at::hasCUDA()) {
      GTEST_SKIP() << "this libtorch has no CUDA or no GPU is visible";
    }
    const std::string dir = testing::GeneratedModelDir("llama");
    cpu_ = LoadOn(dir, "cpu");
    gpu_ = LoadOn(dir, device);
    ASSERT_NE(cpu_, nullptr);
    ASSERT_NE(gpu_, nullptr);
    ASSERT_EQ(gpu_->device().is_cuda(), device != "cpu");
  }

  bool OnDeviceUnderTest(const at::Tensor& t) const { return t.device() == gpu_->device(); }

  // prefix [BOS] + chunks of the given lengths + a 6-token question, each
  // chunk prefilled alone on `model`.
  QueryInput MakeInput(const Model& model, const std::vector<int>& lengths, int seed) {
    const int vocab = static_cast<int>(model.config().vocab_size);
    QueryInput in;
    in.prefix_ids = {static_cast<int32_t>(model.config().bos_token_id.value_or(1))};
    in.chunk_prefix_mode = PrefixMode::kBos;
    for (size_t i = 0; i < lengths.size(); ++i) {
      auto kv = PrefillChunk(model, Ids(lengths[i], seed * 100 + static_cast<int>(i), vocab),
                             PrefixMode::kBos);
      EXPECT_TRUE(kv.ok()) << kv.status();
      if (kv.ok()) in.chunks.push_back(std::make_shared<ChunkKv>(*std::move(kv)));
    }
    in.question_ids = Ids(6, seed * 100 + 99, vocab);
    in.prompt_ids = in.question_ids;
    return in;
  }

  // Logits of every prompt token (on the CPU) after building the context.
  static at::Tensor PromptLogits(const Model& model, const QueryInput& in,
                                 const MethodOptions& options, RecomputePlan* plan = nullptr) {
    absl::StatusOr<BlendedContext> ctx = BuildContext(model, in, options);
    EXPECT_TRUE(ctx.ok()) << ctx.status();
    if (!ctx.ok()) return at::zeros({1});
    ForwardOptions all;
    all.logits = ForwardOptions::Logits::kAll;
    at::Tensor logits =
        PrefillTokens(model, in.prompt_ids, ctx->next_position, &ctx->cache, all).logits;
    if (plan) *plan = ctx->plan;
    return logits.to(at::kCPU);
  }

  std::unique_ptr<Model> cpu_, gpu_;
};

TEST_F(CudaTest, PrefillLogitsMatchTheCpu) {
  const std::vector<int32_t> ids = Ids(200, 5, static_cast<int>(cpu_->config().vocab_size));
  ForwardOptions all;
  all.logits = ForwardOptions::Logits::kAll;
  KvCache cpu_cache(cpu_->n_layers()), gpu_cache(gpu_->n_layers());
  at::Tensor a = PrefillTokens(*cpu_, ids, 0, &cpu_cache, all).logits;
  at::Tensor b = PrefillTokens(*gpu_, ids, 0, &gpu_cache, all).logits;
  EXPECT_TRUE(OnDeviceUnderTest(b));
  EXPECT_LE(MaxAbsDiff(a, b.to(at::kCPU)), 1e-3);
}

TEST_F(CudaTest, RatioOneEqualsFullForEveryMethodOnTheGpu) {
  QueryInput in = MakeInput(*gpu_, {17, 23, 9, 30}, 1);
  MethodOptions full;
  full.method = Method::kFull;
  const at::Tensor ref = PromptLogits(*gpu_, in, full);
  for (Method m : {Method::kInfoFlow, Method::kCacheBlend, Method::kRandom,
                   Method::kCacheBlendPartial, Method::kInfoFlowBlend}) {
    MethodOptions o;
    o.method = m;
    o.ratio = 1.0;
    EXPECT_LE(MaxAbsDiff(PromptLogits(*gpu_, in, o), ref), 1e-4) << MethodName(m);
  }
  MethodOptions epic;
  epic.method = Method::kEpic;
  epic.lego_k = 1000;  // every token of every chunk
  EXPECT_LE(MaxAbsDiff(PromptLogits(*gpu_, in, epic), ref), 1e-4);
  // Chunks that never saw each other: NONE must differ, or the bound above
  // could not fail.
  MethodOptions none;
  none.method = Method::kNone;
  EXPECT_GT(MaxAbsDiff(PromptLogits(*gpu_, in, none), ref), 1e-3);
}

TEST_F(CudaTest, EachMethodRecomputesTheSameTokensAsOnTheCpu) {
  const std::vector<int> lengths = {40, 33, 51, 28};
  QueryInput on_cpu = MakeInput(*cpu_, lengths, 2);
  QueryInput on_gpu = MakeInput(*gpu_, lengths, 2);
  for (Method m : {Method::kInfoFlow, Method::kInfoFlowBlend, Method::kCacheBlend, Method::kNone,
                   Method::kFull}) {
    MethodOptions o;
    o.method = m;
    o.ratio = 0.15;
    RecomputePlan cpu_plan, gpu_plan;
    const at::Tensor a = PromptLogits(*cpu_, on_cpu, o, &cpu_plan);
    const at::Tensor b = PromptLogits(*gpu_, on_gpu, o, &gpu_plan);
    EXPECT_EQ(cpu_plan.selected, gpu_plan.selected) << MethodName(m);
    EXPECT_LE(MaxAbsDiff(a, b), 1e-3) << MethodName(m);
  }
}

TEST_F(CudaTest, ChunkRecordRoundTripsThroughTheHost) {
  // The server's path: prefill on the GPU, encode to host bytes, decode back
  // onto the GPU (raw is exact; int8 within its quantization error).
  QueryInput in = MakeInput(*gpu_, {64}, 3);
  const ChunkKv& kv = *in.chunks[0];
  for (KvCodec::Kind kind : {KvCodec::Kind::kRaw, KvCodec::Kind::kInt8}) {
    KvCodec codec;
    codec.kind = kind;
    absl::StatusOr<std::shared_ptr<const ChunkKv>> back =
        ThroughRecord(*gpu_, kv, PrefixMode::kBos, codec);
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ((*back)->k.size(), kv.k.size());
    for (size_t l = 0; l < kv.k.size(); ++l) {
      EXPECT_TRUE(OnDeviceUnderTest((*back)->k[l]));
      // int8: an affine code per group of 64, so at most half a step of the
      // group's range; 1% of the tensor's largest magnitude bounds that.
      auto bound = [&](const at::Tensor& t) {
        return kind == KvCodec::Kind::kRaw ? 0.0 : 0.01 * t.abs().max().item<double>();
      };
      EXPECT_LE(MaxAbsDiff((*back)->k[l], kv.k[l]), bound(kv.k[l]))
          << KvCodecName(kind) << " layer " << l;
      EXPECT_LE(MaxAbsDiff((*back)->v[l], kv.v[l]), bound(kv.v[l]))
          << KvCodecName(kind) << " layer " << l;
    }
  }
}

}  // namespace
}  // namespace infoflow
