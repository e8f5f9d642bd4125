#include "cache_store/chunk_key.h"

#include <openssl/evp.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace infoflow::store {
namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void AppendU32Le(uint32_t v, char out[4]) {
  out[0] = static_cast<char>(v & 0xff);
  out[1] = static_cast<char>((v >> 8) & 0xff);
  out[2] = static_cast<char>((v >> 16) & 0xff);
  out[3] = static_cast<char>((v >> 24) & 0xff);
}

}  // namespace

size_t KvDtypeSize(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return 4;
    case KvDtype::kF16:
    case KvDtype::kBf16:
      return 2;
    case KvDtype::kInt8:
    case KvDtype::kInt4:
      return 0;
  }
  return 0;
}

int QuantizedBits(KvDtype dtype) {
  return dtype == KvDtype::kInt8 ? 8 : dtype == KvDtype::kInt4 ? 4 : 0;
}
bool IsQuantizedKvDtype(KvDtype dtype) { return QuantizedBits(dtype) != 0; }
bool IsValidKvDtype(uint8_t raw) { return raw >= 1 && raw <= 5; }
bool IsValidPrefixMode(uint8_t raw) { return raw <= 2; }

std::string BytesToHex(std::string_view bytes) {
  std::string out(bytes.size() * 2, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    const auto b = static_cast<uint8_t>(bytes[i]);
    out[2 * i] = kHexDigits[b >> 4];
    out[2 * i + 1] = kHexDigits[b & 0xf];
  }
  return out;
}

std::string ChunkKey::Hex() const { return BytesToHex(AsBytes()); }

absl::StatusOr<ChunkKey> ChunkKey::FromHex(std::string_view hex) {
  if (hex.size() != 2 * kSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk key must be ", 2 * kSize, " hex digits, got ",
                     hex.size(), " characters"));
  }
  ChunkKey key;
  for (size_t i = 0; i < kSize; ++i) {
    const int hi = HexValue(hex[2 * i]);
    const int lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError("chunk key has a non-hex character");
    }
    key.bytes[i] = static_cast<uint8_t>((hi << 4) | lo);
  }
  return key;
}

absl::StatusOr<ChunkKey> ChunkKey::FromBytes(std::string_view raw) {
  if (raw.size() != kSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk key must be ", kSize, " bytes, got ", raw.size()));
  }
  ChunkKey key;
  std::memcpy(key.bytes.data(), raw.data(), kSize);
  return key;
}

struct Sha256Hasher::Ctx {
  EVP_MD_CTX* md = nullptr;
};

Sha256Hasher::Sha256Hasher() : ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  // Allocation failure here is an out-of-memory condition that the rest of
  // the process cannot survive either; EVP_DigestInit_ex on SHA-256 cannot
  // otherwise fail.
  EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr);
}

Sha256Hasher::~Sha256Hasher() { EVP_MD_CTX_free(ctx_->md); }

void Sha256Hasher::Update(std::string_view bytes) {
  EVP_DigestUpdate(ctx_->md, bytes.data(), bytes.size());
}

std::array<uint8_t, 32> Sha256Hasher::Finish() {
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_->md, out.data(), &len);
  return out;
}

std::string Sha256Hasher::FinishHex() {
  const auto digest = Finish();
  return BytesToHex(std::string_view(
      reinterpret_cast<const char*>(digest.data()), digest.size()));
}

std::string Sha256Hex(std::string_view bytes) {
  Sha256Hasher h;
  h.Update(bytes);
  return h.FinishHex();
}

ChunkKey ComputeChunkKey(std::string_view model_fingerprint,
                         PrefixMode prefix_mode, KvDtype dtype,
                         const std::vector<int32_t>& token_ids,
                         uint16_t group_size) {
  Sha256Hasher h;
  char len_le[4];
  AppendU32Le(static_cast<uint32_t>(model_fingerprint.size()), len_le);
  h.Update(std::string_view(len_le, 4));
  h.Update(model_fingerprint);
  const char mode_dtype[2] = {static_cast<char>(prefix_mode),
                              static_cast<char>(dtype)};
  h.Update(std::string_view(mode_dtype, 2));
  if (IsQuantizedKvDtype(dtype)) {
    const char group_le[2] = {static_cast<char>(group_size & 0xff),
                              static_cast<char>(group_size >> 8)};
    h.Update(std::string_view(group_le, 2));
  }
  // Token ids go through a small staging buffer so the key is the same on
  // big-endian hosts; 1 KiB batches keep the EVP call count low.
  char buf[1024];
  size_t used = 0;
  for (int32_t id : token_ids) {
    AppendU32Le(static_cast<uint32_t>(id), buf + used);
    used += 4;
    if (used == sizeof(buf)) {
      h.Update(std::string_view(buf, used));
      used = 0;
    }
  }
  if (used > 0) h.Update(std::string_view(buf, used));
  ChunkKey key;
  key.bytes = h.Finish();
  return key;
}

}  // namespace infoflow::store
