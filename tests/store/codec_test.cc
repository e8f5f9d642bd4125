// Chunk keys and the record codec: round trips, exact layout, and decode
// robustness (truncation, every single-byte flip, hostile sizes, and a
// seeded mutation corpus standing in for the fuzzer in CI).
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cache_store/chunk_key.h"
#include "cache_store/kv_record.h"
#include "gtest/gtest.h"
#include "tests/store/test_records.h"

namespace infoflow::store {
namespace {

using testing::MakeRecord;
using testing::RecordShape;

TEST(ChunkKeyTest, Sha256KnownVector) {
  EXPECT_EQ(Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256Hasher h;
  h.Update("a");
  h.Update("bc");
  EXPECT_EQ(h.FinishHex(), Sha256Hex("abc"));
}

TEST(ChunkKeyTest, HexRoundTrip) {
  const ChunkKey k =
      ComputeChunkKey("fp", PrefixMode::kBos, KvDtype::kBf16, {1, 2, 3});
  const std::string hex = k.Hex();
  ASSERT_EQ(hex.size(), 64u);
  auto back = ChunkKey::FromHex(hex);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, k);
  std::string upper = hex;
  for (char& c : upper) c = static_cast<char>(toupper(c));
  EXPECT_EQ(*ChunkKey::FromHex(upper), k);
  EXPECT_FALSE(ChunkKey::FromHex(hex.substr(1)).ok());
  EXPECT_FALSE(ChunkKey::FromHex(std::string(63, '0') + "g").ok());
  auto raw = ChunkKey::FromBytes(k.AsBytes());
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(*raw, k);
  EXPECT_FALSE(ChunkKey::FromBytes("short").ok());
}

TEST(ChunkKeyTest, MatchesSpecifiedByteLayout) {
  // u32 len ‖ fingerprint ‖ u8 mode ‖ u8 dtype ‖ ids as LE u32.
  std::string bytes("\x02\x00\x00\x00" "fp" "\x01\x03", 8);
  const uint32_t ids[] = {1, 0xffffffffu, 256};
  for (uint32_t id : ids) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>(id >> (8 * i)));
  }
  EXPECT_EQ(ComputeChunkKey("fp", PrefixMode::kBos, KvDtype::kBf16,
                            {1, -1, 256})
                .Hex(),
            Sha256Hex(bytes));
}

TEST(ChunkKeyTest, EveryFieldChangesTheKey) {
  const std::vector<int32_t> ids = {5, 6, 7};
  const ChunkKey base =
      ComputeChunkKey("fp", PrefixMode::kBos, KvDtype::kBf16, ids);
  EXPECT_NE(base, ComputeChunkKey("fq", PrefixMode::kBos, KvDtype::kBf16, ids));
  EXPECT_NE(base, ComputeChunkKey("fp", PrefixMode::kNone, KvDtype::kBf16, ids));
  EXPECT_NE(base, ComputeChunkKey("fp", PrefixMode::kBos, KvDtype::kF16, ids));
  EXPECT_NE(base,
            ComputeChunkKey("fp", PrefixMode::kBos, KvDtype::kBf16, {5, 6}));
  EXPECT_NE(base, ComputeChunkKey("fp", PrefixMode::kBos, KvDtype::kBf16,
                                  {5, 6, 8}));
  // Long id lists cross the internal 1 KiB staging buffer.
  std::vector<int32_t> many(1000);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int32_t>(i);
  std::string bytes("\x02\x00\x00\x00" "fp" "\x01\x03", 8);
  for (int32_t id : many) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>(id >> (8 * i)));
  }
  EXPECT_EQ(
      ComputeChunkKey("fp", PrefixMode::kBos, KvDtype::kBf16, many).Hex(),
      Sha256Hex(bytes));
}

KvRecordHeader SmallHeader() {
  KvRecordHeader h;
  h.dtype = KvDtype::kF32;
  h.prefix_mode = PrefixMode::kChatHeader;
  h.n_layers = 3;
  h.n_kv_heads = 2;
  h.head_dim = 4;
  h.n_tokens = 5;
  h.model_fingerprint = "model-xyz";
  return h;
}

TEST(KvRecordTest, EncodeDecodeRoundTripWithLayerViews) {
  const KvRecordHeader h = SmallHeader();
  const std::vector<int32_t> ids = {10, 20, 30, 40, 2147483647};
  const size_t layer_bytes = 2 * 5 * 4 * 4;
  std::vector<std::string> ks, vs;
  std::vector<KvLayerBytes> layers;
  for (uint32_t l = 0; l < h.n_layers; ++l) {
    ks.emplace_back(layer_bytes, static_cast<char>('a' + l));
    vs.emplace_back(layer_bytes, static_cast<char>('A' + l));
  }
  for (uint32_t l = 0; l < h.n_layers; ++l) layers.push_back({ks[l], vs[l]});
  auto enc = EncodeRecord(h, ids, layers);
  ASSERT_TRUE(enc.ok()) << enc.status();
  EXPECT_EQ(enc->substr(0, 4), "IFKV");

  auto rec = DecodeRecord(*enc);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->header.dtype, h.dtype);
  EXPECT_EQ(rec->header.prefix_mode, h.prefix_mode);
  EXPECT_EQ(rec->header.n_layers, 3u);
  EXPECT_EQ(rec->header.n_kv_heads, 2u);
  EXPECT_EQ(rec->header.head_dim, 4u);
  EXPECT_EQ(rec->header.n_tokens, 5u);
  EXPECT_EQ(rec->header.model_fingerprint, "model-xyz");
  EXPECT_EQ(rec->token_ids, ids);
  EXPECT_EQ(rec->layer_bytes, layer_bytes);
  for (uint32_t l = 0; l < h.n_layers; ++l) {
    EXPECT_EQ(std::string(rec->K(l), layer_bytes), ks[l]);
    EXPECT_EQ(std::string(rec->V(l), layer_bytes), vs[l]);
  }
  // The payload starts 64-byte aligned relative to the record.
  EXPECT_EQ((rec->payload.data() - enc->data()) % kPayloadAlignment, 0);
  EXPECT_EQ(rec->Key(), ComputeChunkKey(h.model_fingerprint, h.prefix_mode,
                                        h.dtype, ids));

  // The contiguous-payload and builder paths produce identical bytes.
  auto enc2 = EncodeRecord(h, ids, rec->payload);
  ASSERT_TRUE(enc2.ok());
  EXPECT_EQ(*enc2, *enc);
  auto b = KvRecordBuilder::Create(h, ids);
  ASSERT_TRUE(b.ok());
  for (uint32_t l = 0; l < h.n_layers; ++l) {
    std::memcpy(b->MutableK(l), ks[l].data(), layer_bytes);
    std::memcpy(b->MutableV(l), vs[l].data(), layer_bytes);
  }
  EXPECT_EQ(std::move(*b).Finish(), *enc);
}

TEST(KvRecordTest, QuantizedLayoutRoundTripAndGroupSizeChecks) {
  KvRecordHeader h;
  h.dtype = KvDtype::kInt4;
  h.group_size = 4;
  h.prefix_mode = PrefixMode::kBos;
  h.n_layers = 2;
  h.n_kv_heads = 3;
  h.head_dim = 6;
  h.n_tokens = 5;
  h.model_fingerprint = "fp";
  absl::StatusOr<KvRecordLayout> layout = ComputeRecordLayout(h);
  ASSERT_TRUE(layout.ok()) << layout.status();
  // Codes: 3*5*6 4-bit values = 45 bytes, padded to 48; K groups
  // 3 x ceil(5/4) x 6 = 36, V groups 3 x ceil(6/4) x 5 = 30, 8 bytes each.
  EXPECT_EQ(layout->codes_bytes, 48u);
  EXPECT_EQ(layout->k_bytes, 48u + 36 * 8);
  EXPECT_EQ(layout->v_bytes, 48u + 30 * 8);
  EXPECT_EQ(layout->layer_bytes, 0u);
  EXPECT_EQ(layout->payload_bytes, 2 * (layout->k_bytes + layout->v_bytes));
  std::vector<std::string> ks, vs;
  std::vector<KvLayerBytes> layers;
  for (uint32_t l = 0; l < h.n_layers; ++l) {
    ks.emplace_back(layout->k_bytes, static_cast<char>('k' + l));
    vs.emplace_back(layout->v_bytes, static_cast<char>('V' + l));
  }
  for (uint32_t l = 0; l < h.n_layers; ++l) layers.push_back({ks[l], vs[l]});
  absl::StatusOr<std::string> bytes = EncodeRecord(h, {1, 2, 3, 4, 5}, layers);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<KvRecord> rec = DecodeRecord(*bytes);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->header.dtype, KvDtype::kInt4);
  EXPECT_EQ(rec->header.group_size, 4);
  for (uint32_t l = 0; l < h.n_layers; ++l) {
    EXPECT_EQ(std::string(rec->K(l), rec->k_bytes), ks[l]);
    EXPECT_EQ(std::string(rec->V(l), rec->v_bytes), vs[l]);
  }
  // The group size is part of the key; raw keys do not depend on it.
  EXPECT_NE(rec->Key(), ComputeChunkKey("fp", PrefixMode::kBos, KvDtype::kInt4, {1, 2, 3, 4, 5}, 8));
  EXPECT_EQ(ComputeChunkKey("fp", PrefixMode::kBos, KvDtype::kF32, {1}, 8),
            ComputeChunkKey("fp", PrefixMode::kBos, KvDtype::kF32, {1}));
  // Not encodable: quantized with group 0 or above the limit, raw with a
  // group, int4 with an odd head_dim.
  for (auto mutate : std::vector<std::function<void(KvRecordHeader*)>>{
           [](KvRecordHeader* x) { x->group_size = 0; },
           [](KvRecordHeader* x) { x->group_size = kMaxGroupSize + 1; },
           [](KvRecordHeader* x) { x->dtype = KvDtype::kF32; },
           [](KvRecordHeader* x) { x->head_dim = 7; }}) {
    KvRecordHeader bad = h;
    mutate(&bad);
    EXPECT_TRUE(absl::IsInvalidArgument(ComputeRecordLayout(bad).status()));
  }
  // A stored group size of 0 for a quantized dtype is corrupt (not a crash).
  std::string zero_group = *bytes;
  zero_group[26] = zero_group[27] = 0;
  EXPECT_TRUE(IsCorruptRecord(DecodeRecord(zero_group).status()));
}

TEST(KvRecordTest, EncodeRejectsBadArguments) {
  KvRecordHeader h = SmallHeader();
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5};
  EXPECT_TRUE(absl::IsInvalidArgument(
      EncodeRecord(h, {1, 2}, std::string(480, 'x')).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      EncodeRecord(h, ids, std::string(479, 'x')).status()));
  std::vector<KvLayerBytes> two(2);
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeRecord(h, ids, two).status()));
  KvRecordHeader zero = h;
  zero.head_dim = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(
      EncodeRecord(zero, ids, std::string()).status()));
  KvRecordHeader no_fp = h;
  no_fp.model_fingerprint.clear();
  EXPECT_FALSE(KvRecordBuilder::Create(no_fp, ids).ok());
  KvRecordHeader huge = h;
  huge.n_layers = huge.n_kv_heads = huge.head_dim = 0xffffffffu;
  EXPECT_FALSE(ComputeRecordLayout(huge).ok());
}

TEST(KvRecordTest, EveryTruncationIsCorrupt) {
  const std::string enc = MakeRecord(7).bytes;
  for (size_t len = 0; len < enc.size(); ++len) {
    auto rec = DecodeRecord(std::string_view(enc.data(), len));
    ASSERT_FALSE(rec.ok()) << len;
    EXPECT_TRUE(IsCorruptRecord(rec.status())) << rec.status();
  }
  EXPECT_TRUE(IsCorruptRecord(DecodeRecord(enc + '\0').status()));
}

TEST(KvRecordTest, EverySingleByteFlipIsCorrupt) {
  const std::string enc = MakeRecord(11).bytes;
  for (size_t i = 0; i < enc.size(); ++i) {
    for (uint8_t mask : {0x01, 0x80, 0xff}) {
      std::string bad = enc;
      bad[i] = static_cast<char>(bad[i] ^ mask);
      auto rec = DecodeRecord(bad);
      ASSERT_FALSE(rec.ok()) << "byte " << i << " mask " << int{mask};
      EXPECT_TRUE(IsCorruptRecord(rec.status()));
    }
  }
}

// Writes a header that claims enormous sizes; decode must reject it from
// the arithmetic alone, without allocating.
TEST(KvRecordTest, HostileSizesAreRejected) {
  std::string enc = MakeRecord(3).bytes;
  const uint32_t values[] = {0xffffffffu, 0x80000000u, 0x10000u};
  for (size_t off : {8u, 12u, 16u, 20u}) {
    for (uint32_t v : values) {
      std::string bad = enc;
      std::memcpy(bad.data() + off, &v, 4);  // little-endian host
      EXPECT_TRUE(IsCorruptRecord(DecodeRecord(bad).status()));
      EXPECT_TRUE(IsCorruptRecord(DecodeRecord(bad, {false}).status()));
    }
  }
  std::string bad = enc;
  bad[24] = static_cast<char>(0xff);
  bad[25] = static_cast<char>(0xff);  // fingerprint length 65535
  EXPECT_TRUE(IsCorruptRecord(DecodeRecord(bad).status()));
}

// The CI stand-in for record_fuzz: random mutations of valid records from a
// seeded generator. Decode must either fail with DataLoss or return a record
// that re-encodes to exactly the input, and never crash (ASan/UBSan builds
// make "never crash" strict).
TEST(KvRecordTest, SeededMutationCorpus) {
  std::mt19937_64 rng(20240601);
  std::vector<std::string> corpus;
  for (uint64_t s = 0; s < 16; ++s) {
    RecordShape shape;
    shape.n_layers = 1 + s % 3;
    shape.n_kv_heads = 1 + s % 2;
    shape.head_dim = 4 << (s % 3);
    shape.n_tokens = 1 + (s * 7) % 23;
    shape.dtype = static_cast<KvDtype>(1 + s % 3);
    corpus.push_back(MakeRecord(s, shape, std::string(1 + s * 5, 'f')).bytes);
  }
  int accepted = 0;
  for (int iter = 0; iter < 40000; ++iter) {
    std::string m = corpus[rng() % corpus.size()];
    const int n_mut = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n_mut; ++k) {
      switch (rng() % 6) {
        case 0:  // bit flip
          if (!m.empty()) m[rng() % m.size()] ^= static_cast<char>(1 << (rng() % 8));
          break;
        case 1:  // random byte
          if (!m.empty()) m[rng() % m.size()] = static_cast<char>(rng());
          break;
        case 2:  // truncate
          m.resize(rng() % (m.size() + 1));
          break;
        case 3:  // append junk
          m.append(rng() % 64, static_cast<char>(rng()));
          break;
        case 4: {  // overwrite a header word with an interesting value
          const uint32_t vals[] = {0, 1, 0xffffffffu, 0x7fffffffu, 0x10000u,
                                   static_cast<uint32_t>(rng())};
          const uint32_t v = vals[rng() % 6];
          if (m.size() >= 44) std::memcpy(m.data() + 4 * (rng() % 11), &v, 4);
          break;
        }
        case 5: {  // splice from another record
          const std::string& o = corpus[rng() % corpus.size()];
          const size_t at = rng() % (m.size() + 1);
          m = m.substr(0, at) + o.substr(std::min(at, o.size()));
          break;
        }
      }
    }
    for (bool verify : {true, false}) {
      DecodeOptions opts;
      opts.verify_checksum = verify;
      auto rec = DecodeRecord(m, opts);
      if (!rec.ok()) {
        ASSERT_TRUE(IsCorruptRecord(rec.status())) << rec.status();
        continue;
      }
      ASSERT_EQ(rec->payload.size(),
                size_t{2} * rec->header.n_layers * rec->layer_bytes);
      ASSERT_LE(rec->payload.data() + rec->payload.size(), m.data() + m.size());
      if (verify) {
        ++accepted;
        auto again = EncodeRecord(rec->header, rec->token_ids, rec->payload);
        ASSERT_TRUE(again.ok());
        ASSERT_EQ(*again, m);
      }
    }
  }
  // Some mutations (e.g. a splice at a point where both records agree)
  // are no-ops; the point is that nothing else got through.
  EXPECT_LT(accepted, 40000);
}

}  // namespace
}  // namespace infoflow::store
