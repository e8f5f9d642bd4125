#include "engine/checkpoint/safetensors.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace infoflow {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "/safetensors_test_XXXXXX";
  char* dir = ::mkdtemp(tmpl.data());
  EXPECT_NE(dir, nullptr);
  return tmpl;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string Le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A file made of a raw header and `data_size` zero bytes.
std::string RawFile(const std::string& header, size_t data_size) {
  return Le64(header.size()) + header + std::string(data_size, '\0');
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

TEST(DTypeTest, NamesAndSizes) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  for (const char* name : {"F32", "F16", "BF16", "I64", "I32", "U8", "BOOL",
                           "F64", "I8", "I16", "U16", "U32", "U64"}) {
    absl::StatusOr<DType> d = ParseDType(name);
    ASSERT_TRUE(d.ok()) << name;
    EXPECT_STREQ(DTypeName(*d), name);
  }
  absl::StatusOr<DType> bad = ParseDType("f32");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("f32"));
  EXPECT_FALSE(ParseDType("F8_E4M3").ok());
}

TEST(ConvertTest, F16KnownValues) {
  EXPECT_EQ(F16ToF32(0x3C00), 1.0f);
  EXPECT_EQ(F16ToF32(0xC000), -2.0f);
  EXPECT_EQ(F16ToF32(0x7BFF), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(F16ToF32(0x8000), 0.0f);
  EXPECT_TRUE(std::signbit(F16ToF32(0x8000)));
  EXPECT_EQ(F16ToF32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(F16ToF32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F16ToF32(0x7E00)));
  EXPECT_TRUE(std::isnan(F16ToF32(0x7C01)));
}

TEST(ConvertTest, F16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f)))) << h;
    } else {
      EXPECT_EQ(F32ToF16(f), h) << h;
    }
  }
}

TEST(ConvertTest, F32ToF16RoundsToNearestEven) {
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // Tie, even.
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // Tie, even.
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.1f, -11)), 0x3C01);      // Above tie.
  EXPECT_EQ(F32ToF16(65519.0f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);  // Tie at the top goes to inf.
  EXPECT_EQ(F32ToF16(1e10f), 0x7C00);
  EXPECT_EQ(F32ToF16(-1e10f), 0xFC00);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // Tie to even 0.
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp tie -> 2.
  EXPECT_EQ(F32ToF16(1e-10f), 0x0000);
  EXPECT_EQ(F32ToF16(-1e-10f), 0x8000);
  // Largest subnormal rounds up into the smallest normal.
  EXPECT_EQ(F32ToF16(std::ldexp(1023.9f, -24)), 0x0400);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(std::nanf("")))));
}

TEST(ConvertTest, BF16) {
  EXPECT_EQ(BF16ToF32(0x3F80), 1.0f);
  EXPECT_EQ(BF16ToF32(0xC040), -3.0f);
  EXPECT_EQ(F32ToBF16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // Tie, even.
  EXPECT_EQ(F32ToBF16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // Tie, even.
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::max()), 0x7F80);  // Overflow.
  // A NaN whose payload is only in the low bits must stay NaN.
  uint32_t nan_bits = 0x7F800001u;
  float nan;
  std::memcpy(&nan, &nan_bits, 4);
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(nan))));
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = BF16ToF32(static_cast<uint16_t>(b));
    if (!std::isnan(f)) {
      EXPECT_EQ(F32ToBF16(f), b) << b;
    }
  }
}

TEST(ConvertTest, ConvertToF32HandlesUnalignedInput) {
  std::vector<uint8_t> buf(1 + 3 * 2);
  const uint16_t halves[3] = {0x3C00, 0xC000, 0x0001};
  std::memcpy(buf.data() + 1, halves, sizeof(halves));
  float out[3];
  ConvertToF32(DType::kF16, buf.data() + 1, 3, out);
  EXPECT_THAT(out, ElementsAre(1.0f, -2.0f, std::ldexp(1.0f, -24)));

  const uint16_t bf[2] = {0x3F80, 0xC040};
  std::memcpy(buf.data() + 1, bf, sizeof(bf));
  ConvertToF32(DType::kBF16, buf.data() + 1, 2, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -3.0f);

  const int64_t ints[2] = {-7, 1 << 20};
  std::vector<uint8_t> ibuf(3 + sizeof(ints));
  std::memcpy(ibuf.data() + 3, ints, sizeof(ints));
  ConvertToF32(DType::kI64, ibuf.data() + 3, 2, out);
  EXPECT_EQ(out[0], -7.0f);
  EXPECT_EQ(out[1], 1048576.0f);
}

class SafetensorsIoTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir(); }
  void TearDown() override {
    std::error_code ec;  // best effort: a leftover temp dir fails nothing
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_;
};

TEST_F(SafetensorsIoTest, WriteThenReadBackExactly) {
  const std::vector<float> f32 = {1.5f, -2.25f, 3.0e-8f, 1e30f, 0.0f, -0.0f};
  const std::vector<float> f16_values = {1.0f, -0.5f, 65504.0f,
                                         std::ldexp(1.0f, -24)};
  const std::vector<float> bf16_values = {1.0f, -3.0f, std::ldexp(1.5f, 66),
                                          0.0078125f};
  std::vector<uint16_t> f16, bf16;
  for (float v : f16_values) f16.push_back(F32ToF16(v));
  for (float v : bf16_values) bf16.push_back(F32ToBF16(v));
  ASSERT_EQ(BF16ToF32(F32ToBF16(std::ldexp(1.5f, 66))), std::ldexp(1.5f, 66))
      << "test value must be exactly representable";
  const int64_t ids[3] = {7, -1, 1LL << 40};
  const float scalar = 42.0f;

  std::vector<TensorToWrite> tensors = {
      {"z.weight", DType::kF32, {2, 3}, f32.data()},
      {"a.half", DType::kF16, {4}, f16.data()},
      {"m.bf16", DType::kBF16, {2, 2}, bf16.data()},
      {"ids", DType::kI64, {3}, ids},
      {"scalar", DType::kF32, {}, &scalar},
      {"empty", DType::kF32, {0, 5}, nullptr},
  };
  const std::string path = dir_ + "/t.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsFile& f = **file;
  EXPECT_THAT(f.Names(), ElementsAre("a.half", "empty", "ids", "m.bf16",
                                     "scalar", "z.weight"));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.Find("nope"), nullptr);

  const TensorInfo* z = f.Find("z.weight");
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(z->dtype, DType::kF32);
  EXPECT_THAT(z->shape, ElementsAre(2, 3));
  EXPECT_EQ(z->nbytes, 24u);
  std::vector<float> got(6);
  ConvertToF32(z->dtype, z->data, 6, got.data());
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(Bits(got[i]), Bits(f32[i])) << i;

  const TensorInfo* h = f.Find("a.half");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->dtype, DType::kF16);
  got.resize(4);
  ConvertToF32(h->dtype, h->data, 4, got.data());
  EXPECT_EQ(got, f16_values);

  const TensorInfo* b = f.Find("m.bf16");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kBF16);
  EXPECT_THAT(b->shape, ElementsAre(2, 2));
  ConvertToF32(b->dtype, b->data, 4, got.data());
  EXPECT_EQ(got, bf16_values);

  const TensorInfo* i = f.Find("ids");
  ASSERT_NE(i, nullptr);
  ASSERT_EQ(i->nbytes, sizeof(ids));
  EXPECT_EQ(std::memcmp(i->data, ids, sizeof(ids)), 0);

  const TensorInfo* s = f.Find("scalar");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->NumElements(), 1);
  EXPECT_EQ(s->nbytes, 4u);

  const TensorInfo* e = f.Find("empty");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->NumElements(), 0);
  EXPECT_EQ(e->nbytes, 0u);
}

TEST_F(SafetensorsIoTest, OutputIsDeterministicAndAligned) {
  const float a[2] = {1, 2};
  const float b[3] = {3, 4, 5};
  const std::string p1 = dir_ + "/1.safetensors";
  const std::string p2 = dir_ + "/2.safetensors";
  ASSERT_TRUE(WriteSafetensors(p1, {{"b", DType::kF32, {3}, b},
                                    {"a", DType::kF32, {2}, a}})
                  .ok());
  ASSERT_TRUE(WriteSafetensors(p2, {{"a", DType::kF32, {2}, a},
                                    {"b", DType::kF32, {3}, b}})
                  .ok());
  const std::string bytes = ReadFile(p1);
  EXPECT_EQ(bytes, ReadFile(p2));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 20);
  std::string expected =
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[8,20]}}";
  ASSERT_GE(n, expected.size());
  ASSERT_LT(n, expected.size() + 8);
  expected.append(n - expected.size(), ' ');
  EXPECT_EQ(bytes.substr(8, n), expected);
  // No leftover temporary file.
  EXPECT_FALSE(std::ifstream(p1 + ".tmp").good());
}

TEST_F(SafetensorsIoTest, WriterRejectsBadInput) {
  const float a[1] = {1};
  const std::string p = dir_ + "/bad.safetensors";
  EXPECT_FALSE(WriteSafetensors(p, {{"x", DType::kF32, {1}, a},
                                    {"x", DType::kF32, {1}, a}})
                   .ok());
  EXPECT_FALSE(WriteSafetensors(p, {{"", DType::kF32, {1}, a}}).ok());
  EXPECT_FALSE(WriteSafetensors(p, {{"x", DType::kF32, {-1}, a}}).ok());
  EXPECT_FALSE(WriteSafetensors(p, {{"x", DType::kF32, {2}, nullptr}}).ok());
  EXPECT_FALSE(
      WriteSafetensors(dir_ + "/no/such/dir/x.safetensors",
                       {{"x", DType::kF32, {1}, a}})
          .ok());
}

TEST_F(SafetensorsIoTest, TruncatedFileNamesTheTensor) {
  std::vector<float> big(100, 1.0f);
  const float small[1] = {2};
  const std::string path = dir_ + "/full.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {{"a.small", DType::kF32, {1}, small},
                                      {"b.big", DType::kF32, {100}, big.data()}})
                  .ok());
  const std::string bytes = ReadFile(path);
  const std::string cut = dir_ + "/cut.safetensors";
  WriteFile(cut, bytes.substr(0, bytes.size() - 10));
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
      SafetensorsFile::Open(cut);
  ASSERT_FALSE(f.ok());
  const std::string msg(f.status().message());
  EXPECT_THAT(msg, HasSubstr("b.big"));
  EXPECT_THAT(msg, HasSubstr(cut));
  EXPECT_THAT(msg, HasSubstr("file is " + std::to_string(bytes.size() - 10) +
                             " bytes"));
  EXPECT_THAT(msg, HasSubstr("ends at " + std::to_string(bytes.size())));

  // Cut inside the header: the length field now overstates it.
  WriteFile(cut, bytes.substr(0, 20));
  f = SafetensorsFile::Open(cut);
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("header length"));

  // Too short for even the length field, and empty.
  WriteFile(cut, bytes.substr(0, 5));
  EXPECT_FALSE(SafetensorsFile::Open(cut).ok());
  WriteFile(cut, "");
  EXPECT_FALSE(SafetensorsFile::Open(cut).ok());
}

TEST_F(SafetensorsIoTest, BadHeaders) {
  const std::string p = dir_ + "/h.safetensors";
  auto open_error = [&](const std::string& bytes) -> std::string {
    WriteFile(p, bytes);
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
        SafetensorsFile::Open(p);
    EXPECT_FALSE(f.ok());
    return f.ok() ? "" : std::string(f.status().message());
  };
  // Header length far beyond the file.
  EXPECT_THAT(open_error(Le64(1ull << 62) + "{}"), HasSubstr("header length"));
  EXPECT_THAT(open_error(Le64(~0ull) + "{}"), HasSubstr("header length"));
  EXPECT_THAT(open_error(RawFile("{not json", 0)), HasSubstr("JSON"));
  EXPECT_THAT(open_error(RawFile("[1,2]", 0)), HasSubstr("object"));
  EXPECT_THAT(
      open_error(RawFile(
          R"({"w":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", 1)),
      ::testing::AllOf(HasSubstr("'w'"), HasSubstr("F8")));
  EXPECT_THAT(
      open_error(RawFile(
          R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)),
      ::testing::AllOf(HasSubstr("'w'"), HasSubstr("need 12")));
  EXPECT_THAT(
      open_error(RawFile(
          R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0)),
      HasSubstr("negative"));
  EXPECT_THAT(
      open_error(RawFile(
          R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4)),
      HasSubstr("reversed"));
  EXPECT_THAT(
      open_error(RawFile(R"({"w":{"dtype":"F32","shape":[1]}})", 4)),
      HasSubstr("data_offsets"));
  EXPECT_THAT(open_error(RawFile(
                  R"({"__metadata__":{"k":1}})", 0)),
              HasSubstr("__metadata__"));
}

TEST(ParseHeaderTest, ValidatesWithoutAFile) {
  absl::StatusOr<SafetensorsHeader> h = SafetensorsFile::ParseHeader(
      R"({"__metadata__":{"format":"pt"},
          "b":{"dtype":"BF16","shape":[2,3],"data_offsets":[4,16]},
          "a":{"dtype":"I32","shape":[],"data_offsets":[0,4]}})",
      16);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->tensors.size(), 2u);
  EXPECT_EQ(h->tensors[0].name, "a");
  EXPECT_EQ(h->tensors[1].name, "b");
  EXPECT_EQ(h->tensors[1].offset, 4u);
  EXPECT_EQ(h->tensors[1].nbytes, 12u);
  EXPECT_EQ(h->tensors[1].data, nullptr);
  EXPECT_EQ(h->metadata.at("format"), "pt");

  // Same header, too little data.
  h = SafetensorsFile::ParseHeader(
      R"({"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[4,16]}})", 15);
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("'b'"));

  // Shape products that overflow 64 bits must not wrap to a small size.
  EXPECT_FALSE(SafetensorsFile::ParseHeader(
                   R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],
                       "data_offsets":[0,0]}})",
                   0)
                   .ok());
  EXPECT_FALSE(SafetensorsFile::ParseHeader(
                   R"({"w":{"dtype":"F64","shape":[2305843009213693952],
                       "data_offsets":[0,0]}})",
                   0)
                   .ok());
  // ...but a zero dimension makes any shape empty.
  EXPECT_TRUE(SafetensorsFile::ParseHeader(
                  R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,0],
                      "data_offsets":[0,0]}})",
                  0)
                  .ok());

  for (const char* junk :
       {"", "null", "1", "\"s\"", "{\"w\":1}", "{\"w\":{}}",
        "{\"w\":{\"dtype\":1}}", "{\"w\":{\"dtype\":\"F32\",\"shape\":1}}",
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}",
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}",
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}",
        "{\"__metadata__\":[]}", "\xff\xfe"}) {
    EXPECT_FALSE(SafetensorsFile::ParseHeader(junk, 100).ok()) << junk;
  }
  // Deep nesting must neither crash nor be accepted.
  std::string deep(100000, '[');
  EXPECT_FALSE(SafetensorsFile::ParseHeader(deep, 0).ok());
  deep += std::string(100000, ']');
  EXPECT_FALSE(SafetensorsFile::ParseHeader(deep, 0).ok());
}

TEST_F(SafetensorsIoTest, ShardedModel) {
  const float a[2] = {1, 2};
  const float b[3] = {3, 4, 5};
  const uint16_t c[1] = {0x3F80};
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model-00001-of-00002.safetensors",
                               {{"layer.0.w", DType::kF32, {2}, a},
                                {"embed", DType::kF32, {3}, b}})
                  .ok());
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model-00002-of-00002.safetensors",
                               {{"layer.1.w", DType::kBF16, {1}, c}})
                  .ok());
  WriteFile(dir_ + "/model.safetensors.index.json", R"({
    "metadata": {"total_size": 22},
    "weight_map": {
      "embed": "model-00001-of-00002.safetensors",
      "layer.0.w": "model-00001-of-00002.safetensors",
      "layer.1.w": "model-00002-of-00002.safetensors"
    }})");
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> m =
      SafetensorsModel::Open(dir_);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->num_files(), 2u);
  EXPECT_THAT((*m)->Names(), ElementsAre("embed", "layer.0.w", "layer.1.w"));
  const TensorInfo* t = (*m)->Find("layer.1.w");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kBF16);
  float v;
  ConvertToF32(t->dtype, t->data, 1, &v);
  EXPECT_EQ(v, 1.0f);
  t = (*m)->Find("embed");
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->shape, ElementsAre(3));
  EXPECT_EQ((*m)->Find("missing"), nullptr);
  absl::StatusOr<const TensorInfo*> g = (*m)->Get("missing");
  ASSERT_FALSE(g.ok());
  EXPECT_TRUE(absl::IsNotFound(g.status()));
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("missing"));

  // Index naming a tensor its shard lacks.
  WriteFile(dir_ + "/model.safetensors.index.json", R"({"weight_map": {
      "ghost": "model-00002-of-00002.safetensors"}})");
  m = SafetensorsModel::Open(dir_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()),
              ::testing::AllOf(HasSubstr("ghost"),
                               HasSubstr("model-00002-of-00002")));

  // Index naming a shard that does not exist.
  WriteFile(dir_ + "/model.safetensors.index.json", R"({"weight_map": {
      "x": "model-00003-of-00002.safetensors"}})");
  m = SafetensorsModel::Open(dir_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("model-00003-of-00002.safetensors"));

  // Shards outside the directory are refused.
  WriteFile(dir_ + "/model.safetensors.index.json",
            R"({"weight_map": {"x": "../etc.safetensors"}})");
  EXPECT_FALSE(SafetensorsModel::Open(dir_).ok());

  WriteFile(dir_ + "/model.safetensors.index.json", "{oops");
  m = SafetensorsModel::Open(dir_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("index.json"));
}

TEST_F(SafetensorsIoTest, MissingModel) {
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> m =
      SafetensorsModel::Open(dir_);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::IsNotFound(m.status()));
  EXPECT_THAT(std::string(m.status().message()), HasSubstr(dir_));
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
      SafetensorsFile::Open(dir_ + "/nope.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(absl::IsNotFound(f.status()));
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("nope.safetensors"));
}

TEST(RealCheckpointTest, Stories260K) {
  const std::string dir = INFOFLOW_STORIES260K_DIR;
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
      SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  const TensorInfo* embed = (*f)->Find("model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(embed->dtype, DType::kF32);
  EXPECT_THAT(embed->shape, ElementsAre(512, 64));
  EXPECT_EQ(embed->nbytes, 512u * 64u * 4u);

  std::vector<std::string> expected = {"model.embed_tokens.weight",
                                       "model.norm.weight"};
  for (int l = 0; l < 5; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* s :
         {"input_layernorm.weight", "post_attention_layernorm.weight",
          "self_attn.q_proj.weight", "self_attn.k_proj.weight",
          "self_attn.v_proj.weight", "self_attn.o_proj.weight",
          "mlp.gate_proj.weight", "mlp.up_proj.weight",
          "mlp.down_proj.weight"}) {
      expected.push_back(p + s);
    }
  }
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ((*f)->Names(), expected);  // Tied embeddings: no lm_head.
  const TensorInfo* k = (*f)->Find("model.layers.4.self_attn.k_proj.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_THAT(k->shape, ElementsAre(32, 64));
  const TensorInfo* down = (*f)->Find("model.layers.0.mlp.down_proj.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_THAT(down->shape, ElementsAre(64, 172));

  // The weights are real numbers, not zeros or garbage.
  std::vector<float> w(static_cast<size_t>(embed->NumElements()));
  ConvertToF32(embed->dtype, embed->data, w.size(), w.data());
  double sum_sq = 0;
  for (float x : w) {
    ASSERT_TRUE(std::isfinite(x));
    sum_sq += static_cast<double>(x) * x;
  }
  EXPECT_GT(sum_sq, 0.0);

  absl::StatusOr<std::unique_ptr<SafetensorsModel>> m =
      SafetensorsModel::Open(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->num_files(), 1u);
  EXPECT_EQ((*m)->Names(), expected);
  EXPECT_NE((*m)->Find("model.norm.weight"), nullptr);
}

}  // namespace
}  // namespace infoflow
