// Tests for engine/checkpoint/gguf_writer.h and gguf_export.h without
// llama.cpp: the files are parsed back by the small GGUF reader below,
// written for this test from the GGUF specification (not the writer's code).
// The round trip through llama.cpp itself is tests/engine/gguf_llama_cpp_test.sh
// (ctest label `network`).
#include "engine/checkpoint/gguf_writer.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include <unistd.h>

#include "engine/checkpoint/gguf_export.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/model/test_model.h"
#include "engine/text/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace infoflow {
namespace {

namespace fs = std::filesystem;

// ---- An independent GGUF v3 reader (spec: magic, version, counts, KVs,
// tensor infos, alignment padding, data section).
struct Value {
  uint32_t type = 0;
  uint64_t u = 0;  // unsigned ints and bool
  int64_t i = 0;   // signed ints
  double f = 0;    // floats
  std::string s;
  uint32_t array_type = 0;
  std::vector<Value> array;
};

struct TensorEntry {
  std::vector<uint64_t> dims;
  uint32_t type = 0;
  uint64_t offset = 0;
};

struct Parsed {
  uint32_t version = 0;
  std::vector<std::string> key_order;
  std::map<std::string, Value> kv;
  std::vector<std::string> tensor_order;
  std::map<std::string, TensorEntry> tensors;
  uint64_t data_start = 0;
  std::string bytes;  // the whole file
};

class Reader {
 public:
  explicit Reader(const std::string& b) : b_(b) {}
  template <typename T>
  T Get() {
    if (pos_ + sizeof(T) > b_.size()) throw std::runtime_error("truncated");
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string Str() {
    const uint64_t n = Get<uint64_t>();
    if (pos_ + n > b_.size()) throw std::runtime_error("truncated string");
    std::string s = b_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  Value Val(uint32_t type) {
    Value v;
    v.type = type;
    switch (type) {
      case 0:
        v.u = Get<uint8_t>();
        break;
      case 1:
        v.i = Get<int8_t>();
        break;
      case 2:
        v.u = Get<uint16_t>();
        break;
      case 3:
        v.i = Get<int16_t>();
        break;
      case 4:
        v.u = Get<uint32_t>();
        break;
      case 5:
        v.i = Get<int32_t>();
        break;
      case 6:
        v.f = Get<float>();
        break;
      case 7:
        v.u = Get<uint8_t>();
        break;
      case 8:
        v.s = Str();
        break;
      case 9: {
        v.array_type = Get<uint32_t>();
        const uint64_t n = Get<uint64_t>();
        for (uint64_t k = 0; k < n; ++k) v.array.push_back(Val(v.array_type));
        break;
      }
      case 10:
        v.u = Get<uint64_t>();
        break;
      case 11:
        v.i = Get<int64_t>();
        break;
      case 12:
        v.f = Get<double>();
        break;
      default:
        throw std::runtime_error("bad value type " + std::to_string(type));
    }
    return v;
  }
  uint64_t pos() const { return pos_; }

 private:
  const std::string& b_;
  uint64_t pos_ = 0;
};

Parsed ParseGguf(const std::string& path) {
  Parsed p;
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  p.bytes = ss.str();
  Reader r(p.bytes);
  if (p.bytes.compare(0, 4, "GGUF") != 0) throw std::runtime_error("no GGUF magic");
  r.Get<uint32_t>();
  p.version = r.Get<uint32_t>();
  const uint64_t n_tensors = r.Get<uint64_t>(), n_kv = r.Get<uint64_t>();
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = r.Str();
    const uint32_t type = r.Get<uint32_t>();
    p.key_order.push_back(key);
    p.kv[key] = r.Val(type);
  }
  for (uint64_t t = 0; t < n_tensors; ++t) {
    std::string name = r.Str();
    TensorEntry e;
    const uint32_t nd = r.Get<uint32_t>();
    for (uint32_t d = 0; d < nd; ++d) e.dims.push_back(r.Get<uint64_t>());
    e.type = r.Get<uint32_t>();
    e.offset = r.Get<uint64_t>();
    p.tensor_order.push_back(name);
    p.tensors[name] = e;
  }
  uint64_t alignment = 32;
  if (p.kv.count("general.alignment")) alignment = p.kv["general.alignment"].u;
  p.data_start = (r.pos() + alignment - 1) / alignment * alignment;
  return p;
}

uint64_t Elements(const TensorEntry& e) {
  uint64_t n = 1;
  for (uint64_t d : e.dims) n *= d;
  return n;
}

std::vector<float> TensorF32(const Parsed& p, const std::string& name) {
  const TensorEntry& e = p.tensors.at(name);
  std::vector<float> out(Elements(e));
  const char* at = p.bytes.data() + p.data_start + e.offset;
  if (e.type == 0) {
    std::memcpy(out.data(), at, out.size() * 4);
  } else {
    for (size_t k = 0; k < out.size(); ++k) {
      uint16_t h;
      std::memcpy(&h, at + 2 * k, 2);
      out[k] = F16ToF32(h);
    }
  }
  return out;
}

// One directory per process, removed at exit.
struct TempDir {
  fs::path path =
      fs::temp_directory_path() / ("infoflow_gguf_test_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string TempPath(const std::string& name) {
  static TempDir dir;
  return (dir.path / name).string();
}

TEST(GgufWriter, HeaderMetadataTensorTableAndDataReadBack) {
  for (uint32_t alignment : {32u, 64u}) {
    SCOPED_TRACE(alignment);
    gguf::GgufWriter w(alignment);
    w.AddString("general.architecture", "llama");
    w.AddUint32("llama.block_count", 7);
    w.AddInt32("some.int", -5);
    w.AddFloat32("llama.rope.freq_base", 500000.0f);
    w.AddBool("flag", true);
    w.AddStringArray("tokens", {"a", "", "\xC4\xA0the"});
    w.AddInt32Array("types", {1, 3, -2});
    const std::vector<float> a = {1.5f, -2.0f, 3.25f};  // 12 bytes: padding follows
    std::vector<uint16_t> b(15);
    for (size_t k = 0; k < b.size(); ++k) b[k] = F32ToF16(0.5f * static_cast<float>(k));
    std::vector<float> c(2 * 3 * 5);
    for (size_t k = 0; k < c.size(); ++k) c[k] = static_cast<float>(k) - 7.0f;
    ASSERT_TRUE(w.AddTensor("a", {3}, gguf::TensorType::kF32, a.data(), 12).ok());
    ASSERT_TRUE(w.AddTensor("b", {5, 3}, gguf::TensorType::kF16, b.data(), 30).ok());
    ASSERT_TRUE(w.AddTensor("blk.0.c", {5, 3, 2}, gguf::TensorType::kF32, c.data(), 120).ok());
    const std::string path = TempPath("w" + std::to_string(alignment) + ".gguf");
    ASSERT_TRUE(w.WriteFile(path).ok());
    EXPECT_FALSE(fs::exists(path + ".tmp"));

    const Parsed p = ParseGguf(path);
    EXPECT_EQ(p.version, 3u);
    ASSERT_EQ(p.key_order.size(), 8u);
    EXPECT_EQ(p.key_order[0], "general.alignment");
    EXPECT_EQ(p.kv.at("general.alignment").type, 4u);
    EXPECT_EQ(p.kv.at("general.alignment").u, alignment);
    EXPECT_EQ(p.key_order[1], "general.architecture");
    EXPECT_EQ(p.kv.at("general.architecture").s, "llama");
    EXPECT_EQ(p.kv.at("llama.block_count").type, 4u);
    EXPECT_EQ(p.kv.at("llama.block_count").u, 7u);
    EXPECT_EQ(p.kv.at("some.int").type, 5u);
    EXPECT_EQ(p.kv.at("some.int").i, -5);
    EXPECT_EQ(p.kv.at("llama.rope.freq_base").type, 6u);
    EXPECT_EQ(p.kv.at("llama.rope.freq_base").f, 500000.0);
    EXPECT_EQ(p.kv.at("flag").type, 7u);
    EXPECT_EQ(p.kv.at("flag").u, 1u);
    const Value& tokens = p.kv.at("tokens");
    EXPECT_EQ(tokens.type, 9u);
    EXPECT_EQ(tokens.array_type, 8u);
    ASSERT_EQ(tokens.array.size(), 3u);
    EXPECT_EQ(tokens.array[1].s, "");
    EXPECT_EQ(tokens.array[2].s, "\xC4\xA0the");
    const Value& types = p.kv.at("types");
    EXPECT_EQ(types.array_type, 5u);
    ASSERT_EQ(types.array.size(), 3u);
    EXPECT_EQ(types.array[2].i, -2);

    ASSERT_EQ(p.tensor_order, (std::vector<std::string>{"a", "b", "blk.0.c"}));
    EXPECT_EQ(p.tensors.at("b").dims, (std::vector<uint64_t>{5, 3}));
    EXPECT_EQ(p.tensors.at("b").type, 1u);
    EXPECT_EQ(p.tensors.at("blk.0.c").dims, (std::vector<uint64_t>{5, 3, 2}));
    EXPECT_EQ(p.data_start % alignment, 0u);
    uint64_t expect_offset = 0;
    for (const std::string& name : p.tensor_order) {
      const TensorEntry& e = p.tensors.at(name);
      EXPECT_EQ(e.offset, expect_offset) << name;
      EXPECT_EQ(e.offset % alignment, 0u) << name;
      const uint64_t bytes = Elements(e) * (e.type == 1 ? 2 : 4);
      expect_offset = (e.offset + bytes + alignment - 1) / alignment * alignment;
    }
    EXPECT_EQ(p.bytes.size(), p.data_start + expect_offset);
    EXPECT_EQ(TensorF32(p, "a"), a);
    EXPECT_EQ(TensorF32(p, "blk.0.c"), c);
    const std::vector<float> bf = TensorF32(p, "b");
    for (size_t k = 0; k < b.size(); ++k) EXPECT_EQ(bf[k], 0.5f * static_cast<float>(k));
    // Padding is zeros.
    EXPECT_EQ(p.bytes.substr(p.data_start + 12, 20), std::string(20, '\0'));
  }
}

TEST(GgufWriter, RefusesBadInput) {
  const float x[4] = {};
  gguf::GgufWriter w;
  EXPECT_FALSE(w.AddTensor("t", {3}, gguf::TensorType::kF32, x, 16).ok());  // size mismatch
  EXPECT_FALSE(w.AddTensor("", {4}, gguf::TensorType::kF32, x, 16).ok());
  EXPECT_FALSE(w.AddTensor(std::string(64, 'n'), {4}, gguf::TensorType::kF32, x, 16).ok());
  EXPECT_FALSE(w.AddTensor("t", {}, gguf::TensorType::kF32, x, 0).ok());
  EXPECT_FALSE(w.AddTensor("t", {0, 4}, gguf::TensorType::kF32, x, 0).ok());
  EXPECT_TRUE(w.AddTensor("t", {2, 2}, gguf::TensorType::kF32, x, 16).ok());
  EXPECT_FALSE(w.AddTensor("t", {4}, gguf::TensorType::kF32, x, 16).ok());  // duplicate
  EXPECT_TRUE(w.WriteFile(TempPath("ok.gguf")).ok());
  gguf::GgufWriter dup;
  dup.AddUint32("k", 1);
  dup.AddUint32("k", 2);
  EXPECT_FALSE(dup.WriteFile(TempPath("dup.gguf")).ok());
  gguf::GgufWriter own;
  own.AddUint32("general.alignment", 64);
  EXPECT_FALSE(own.WriteFile(TempPath("own.gguf")).ok());
  gguf::GgufWriter odd(24);
  EXPECT_FALSE(odd.WriteFile(TempPath("odd.gguf")).ok());
}

// Rotary embedding of one head vector, as the engine (rotate half: i with
// i + d/2) or llama.cpp's llama architecture (adjacent: 2i with 2i + 1).
std::vector<double> Rope(const std::vector<double>& x, int64_t pos, double theta, bool adjacent) {
  const size_t d = x.size(), half = d / 2;
  std::vector<double> y(d);
  for (size_t i = 0; i < half; ++i) {
    const double a = pos * std::pow(theta, -2.0 * i / d), c = std::cos(a), s = std::sin(a);
    const size_t i0 = adjacent ? 2 * i : i, i1 = adjacent ? 2 * i + 1 : i + half;
    y[i0] = x[i0] * c - x[i1] * s;
    y[i1] = x[i1] * c + x[i0] * s;
  }
  return y;
}

TEST(GgufExport, PermutedQkGiveTheSameAttentionScoresUnderAdjacentRope) {
  const int64_t heads = 2, hd = 8, cols = 5;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> wq(heads * hd * cols), wk(heads * hd * cols), h1(cols), h2(cols);
  for (float& v : wq) v = nd(rng);
  for (float& v : wk) v = nd(rng);
  for (float& v : h1) v = nd(rng);
  for (float& v : h2) v = nd(rng);
  const std::vector<float> pq = PermuteRowsForAdjacentRope(wq, heads, hd, cols);
  const std::vector<float> pk = PermuteRowsForAdjacentRope(wk, heads, hd, cols);
  auto project = [&](const std::vector<float>& w, const std::vector<float>& h, int64_t head) {
    std::vector<double> y(hd);
    for (int64_t r = 0; r < hd; ++r) {
      for (int64_t k = 0; k < cols; ++k) y[r] += w[(head * hd + r) * cols + k] * h[k];
    }
    return y;
  };
  for (int64_t head = 0; head < heads; ++head) {
    const std::vector<double> q = Rope(project(wq, h1, head), 37, 10000, false);
    const std::vector<double> k = Rope(project(wk, h2, head), 5, 10000, false);
    const std::vector<double> q2 = Rope(project(pq, h1, head), 37, 10000, true);
    const std::vector<double> k2 = Rope(project(pk, h2, head), 5, 10000, true);
    double dot = 0, dot2 = 0;
    for (int64_t r = 0; r < hd; ++r) dot += q[r] * k[r], dot2 += q2[r] * k2[r];
    EXPECT_NEAR(dot, dot2, 1e-9) << head;
    // Not a no-op: without the permutation the scores differ.
    const std::vector<double> q3 = Rope(project(wq, h1, head), 37, 10000, true);
    const std::vector<double> k3 = Rope(project(wk, h2, head), 5, 10000, true);
    double dot3 = 0;
    for (int64_t r = 0; r < hd; ++r) dot3 += q3[r] * k3[r];
    EXPECT_GT(std::fabs(dot - dot3), 1e-3) << head;
  }
}

std::string MakeModel(const std::string& name, const TestModelSpec& spec) {
  const std::string dir = TempPath(name);
  EXPECT_TRUE(WriteTestModel(dir, spec).ok());
  return dir;
}

TEST(GgufExport, LlamaModelMetadataTokenizerAndTensors) {
  TestModelSpec spec;
  spec.num_layers = 2;
  spec.vocab_size = 320;
  const std::string dir = MakeModel("llama", spec);
  for (const char* dtype : {"f32", "f16"}) {
    SCOPED_TRACE(dtype);
    GgufExportOptions o;
    o.dtype = std::string(dtype) == "f16" ? gguf::TensorType::kF16 : gguf::TensorType::kF32;
    const std::string path = TempPath(std::string("llama-") + dtype + ".gguf");
    absl::StatusOr<GgufExportSummary> s = ExportGguf(dir, path, o);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->tokenizer_pre, "gpt-2");
    const Parsed p = ParseGguf(path);
    EXPECT_EQ(p.kv.at("general.architecture").s, "llama");
    EXPECT_EQ(p.kv.at("general.file_type").u, o.dtype == gguf::TensorType::kF16 ? 1u : 0u);
    EXPECT_EQ(p.kv.at("llama.block_count").u, 2u);
    EXPECT_EQ(p.kv.at("llama.embedding_length").u, 64u);
    EXPECT_EQ(p.kv.at("llama.feed_forward_length").u, 128u);
    EXPECT_EQ(p.kv.at("llama.attention.head_count").u, 4u);
    EXPECT_EQ(p.kv.at("llama.attention.head_count_kv").u, 2u);
    EXPECT_EQ(p.kv.at("llama.rope.dimension_count").u, 16u);
    EXPECT_EQ(p.kv.at("llama.context_length").u, 4096u);
    EXPECT_EQ(p.kv.at("llama.rope.freq_base").f, 10000.0);
    EXPECT_NEAR(p.kv.at("llama.attention.layer_norm_rms_epsilon").f,
                TestModelConfig(spec).rms_norm_eps, 1e-12);
    EXPECT_EQ(p.kv.at("tokenizer.ggml.model").s, "gpt2");
    EXPECT_EQ(p.kv.at("tokenizer.ggml.pre").s, "gpt-2");

    // Tokens by id, as the engine's tokenizer has them; specials are CONTROL.
    auto tok = Tokenizer::FromFile(dir + "/tokenizer.json");
    ASSERT_TRUE(tok.ok());
    const Value& tokens = p.kv.at("tokenizer.ggml.tokens");
    const Value& types = p.kv.at("tokenizer.ggml.token_type");
    ASSERT_EQ(tokens.array.size(), 320u);
    ASSERT_EQ(types.array.size(), 320u);
    for (int id = 0; id < (*tok)->vocab_size(); ++id) {
      EXPECT_EQ(tokens.array[id].s, (*tok)->IdToToken(id)) << id;
      EXPECT_EQ(types.array[id].i, (*tok)->IsSpecial(id) ? 3 : 1) << id;
    }
    const nlohmann::json tj = nlohmann::json::parse(std::ifstream(dir + "/tokenizer.json"));
    EXPECT_EQ(p.kv.at("tokenizer.ggml.merges").array.size(), tj["model"]["merges"].size());
    EXPECT_EQ(p.kv.at("tokenizer.ggml.bos_token_id").u,
              static_cast<uint64_t>(*(*tok)->TokenToId("<s>")));
    EXPECT_EQ(p.kv.at("tokenizer.ggml.eos_token_id").u,
              static_cast<uint64_t>(*(*tok)->TokenToId("</s>")));

    // Tensors: HF shapes reversed, norms F32, q/k rows permuted per head.
    EXPECT_EQ(p.tensors.size(), 2u + 2 * 9 + 1);  // embd, output_norm, 9 per layer, output
    auto st = SafetensorsModel::Open(dir);
    ASSERT_TRUE(st.ok());
    auto hf = [&](const std::string& name) {
      const TensorInfo* t = (*st)->Find(name);
      std::vector<float> v(t->NumElements());
      ConvertToF32(t->dtype, t->data, v.size(), v.data());
      return v;
    };
    const float tol = o.dtype == gguf::TensorType::kF16 ? 1e-3f : 0.0f;
    auto expect_close = [&](const std::vector<float>& got, const std::vector<float>& want,
                            const std::string& what) {
      ASSERT_EQ(got.size(), want.size()) << what;
      for (size_t k = 0; k < got.size(); ++k) {
        ASSERT_NEAR(got[k], want[k], tol * (1 + std::fabs(want[k]))) << what << " " << k;
      }
    };
    EXPECT_EQ(p.tensors.at("token_embd.weight").dims, (std::vector<uint64_t>{64, 320}));
    expect_close(TensorF32(p, "token_embd.weight"), hf("model.embed_tokens.weight"), "embd");
    expect_close(TensorF32(p, "output.weight"), hf("lm_head.weight"), "output");
    EXPECT_EQ(p.tensors.at("blk.1.attn_norm.weight").type, 0u);
    EXPECT_EQ(p.tensors.at("output_norm.weight").type, 0u);
    EXPECT_EQ(p.tensors.at("blk.0.ffn_gate.weight").type,
              o.dtype == gguf::TensorType::kF16 ? 1u : 0u);
    EXPECT_EQ(p.tensors.at("blk.0.ffn_down.weight").dims, (std::vector<uint64_t>{128, 64}));
    expect_close(TensorF32(p, "blk.1.ffn_down.weight"), hf("model.layers.1.mlp.down_proj.weight"),
                 "down");
    expect_close(TensorF32(p, "blk.1.attn_v.weight"), hf("model.layers.1.self_attn.v_proj.weight"),
                 "v");
    expect_close(TensorF32(p, "blk.0.attn_norm.weight"),
                 hf("model.layers.0.input_layernorm.weight"), "norm");
    const std::vector<float> q = hf("model.layers.1.self_attn.q_proj.weight");
    const std::vector<float> gq = TensorF32(p, "blk.1.attn_q.weight");
    const std::vector<float> k = hf("model.layers.1.self_attn.k_proj.weight");
    const std::vector<float> gk = TensorF32(p, "blk.1.attn_k.weight");
    EXPECT_EQ(p.tensors.at("blk.1.attn_k.weight").dims, (std::vector<uint64_t>{64, 32}));
    const int64_t hd = 16, d = 64;
    for (int64_t h = 0; h < 4; ++h) {
      for (int64_t i = 0; i < hd / 2; ++i) {
        for (int64_t j = 0; j < 2; ++j) {
          for (int64_t col = 0; col < d; ++col) {
            const float want = q[(h * hd + j * hd / 2 + i) * d + col];
            ASSERT_NEAR(gq[(h * hd + 2 * i + j) * d + col], want, tol * (1 + std::fabs(want)));
            if (h < 2) {
              const float wk = k[(h * hd + j * hd / 2 + i) * d + col];
              ASSERT_NEAR(gk[(h * hd + 2 * i + j) * d + col], wk, tol * (1 + std::fabs(wk)));
            }
          }
        }
      }
    }
  }
}

TEST(GgufExport, TiedEmbeddingsLeaveOutputOutAndMissingIdsArePadding) {
  TestModelSpec spec;
  spec.num_layers = 1;
  spec.vocab_size = 300;
  spec.tie_word_embeddings = true;
  const std::string dir = MakeModel("tied", spec);
  // Drop the last learned token from tokenizer.json: id 299 is then one the
  // tokenizer lacks, which GGUF still needs (its token list is n_vocab long).
  nlohmann::json tj = nlohmann::json::parse(std::ifstream(dir + "/tokenizer.json"));
  std::string last;
  for (const auto& [text, id] : tj["model"]["vocab"].items()) {
    if (id.get<int>() == 299) last = text;
  }
  ASSERT_FALSE(last.empty());
  tj["model"]["vocab"].erase(last);
  tj["model"]["merges"].erase(tj["model"]["merges"].size() - 1);
  std::ofstream(dir + "/tokenizer.json") << tj.dump();
  const std::string path = TempPath("tied.gguf");
  auto s = ExportGguf(dir, path, {});
  ASSERT_TRUE(s.ok()) << s.status();
  const Parsed p = ParseGguf(path);
  EXPECT_EQ(p.tensors.count("output.weight"), 0u);
  EXPECT_EQ(p.tensors.count("token_embd.weight"), 1u);
  EXPECT_EQ(p.kv.at("tokenizer.ggml.add_bos_token").u, 1u);
  EXPECT_EQ(p.kv.at("tokenizer.ggml.tokens").array.at(299).s, "[PAD299]");
  EXPECT_EQ(p.kv.at("tokenizer.ggml.token_type").array.at(299).i, 5);  // UNUSED
  EXPECT_EQ(p.kv.at("tokenizer.ggml.token_type").array.at(298).i, 1);
  EXPECT_EQ(s->notes.size(), 1u);
}

TEST(GgufExport, RefusesWhatLlamaArchitectureCannotRepresent) {
  for (const char* type : {"qwen3", "qwen2", "glm4"}) {
    TestModelSpec spec = DefaultTestModelSpec(type);
    spec.num_layers = 1;
    const std::string dir = MakeModel(std::string("refuse-") + type, spec);
    auto s = ExportGguf(dir, TempPath("refused.gguf"), {});
    ASSERT_FALSE(s.ok()) << type;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(s.status().message()).find(type), std::string::npos) << s.status();
  }
  // The shipped model's 1-2 digit split has no llama.cpp pre-tokenizer.
  const std::string tiny = std::string(INFOFLOW_SOURCE_DIR) + "/models/infoflow-tiny";
  auto refused = ExportGguf(tiny, TempPath("tiny.gguf"), {});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(std::string(refused.status().message()).find("--tokenizer-pre"), std::string::npos);
  GgufExportOptions o;
  o.tokenizer_pre = "gpt-2";
  auto forced = ExportGguf(tiny, TempPath("tiny.gguf"), o);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_FALSE(forced->notes.empty());
  const Parsed p = ParseGguf(TempPath("tiny.gguf"));
  EXPECT_EQ(p.tensors.count("output.weight"), 0u);  // tied
  EXPECT_EQ(p.kv.at("llama.attention.head_count_kv").u, 2u);
}

TEST(GgufExport, DetectsLlamaCppPreTokenizers) {
  auto seq = [](const std::string& regex) {
    nlohmann::json t = {
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", regex}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}}};
    return t.dump();
  };
  EXPECT_EQ(*DetectLlamaCppPreTokenizer(
                R"({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false}})"),
            "gpt-2");
  EXPECT_EQ(
      *DetectLlamaCppPreTokenizer(seq(
          R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)")),
      "llama-bpe");
  EXPECT_EQ(
      *DetectLlamaCppPreTokenizer(seq(
          R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)")),
      "qwen2");
  EXPECT_FALSE(DetectLlamaCppPreTokenizer(seq(R"(\p{N}{1,2})")).ok());
  EXPECT_FALSE(DetectLlamaCppPreTokenizer(
                   R"({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": true}})")
                   .ok());
}

}  // namespace
}  // namespace infoflow
