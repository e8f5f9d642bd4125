#include "engine/checkpoint/gguf_writer.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace infoflow::gguf {
namespace {

template <typename T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // The targets here are little-endian (x86-64, aarch64).
  out->append(b, sizeof(T));
}

void PutString(std::string* out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out->append(s);
}

uint64_t AlignUp(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

}  // namespace

size_t TensorTypeSize(TensorType type) { return type == TensorType::kF16 ? 2 : 4; }

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {}

void GgufWriter::AddKv(const std::string& key, ValueType type, std::string encoded_value) {
  if (key_error_.empty()) {
    if (key.empty())
      key_error_ = "empty metadata key";
    else if (key == "general.alignment")
      key_error_ = "general.alignment is set by the writer";
    else if (!keys_.insert(key).second)
      key_error_ = "duplicate metadata key " + key;
  }
  std::string kv;
  PutString(&kv, key);
  Put<uint32_t>(&kv, static_cast<uint32_t>(type));
  kv += encoded_value;
  kvs_.push_back(std::move(kv));
}

void GgufWriter::AddString(const std::string& key, const std::string& value) {
  std::string v;
  PutString(&v, value);
  AddKv(key, ValueType::kString, std::move(v));
}

void GgufWriter::AddUint32(const std::string& key, uint32_t value) {
  std::string v;
  Put<uint32_t>(&v, value);
  AddKv(key, ValueType::kUint32, std::move(v));
}

void GgufWriter::AddInt32(const std::string& key, int32_t value) {
  std::string v;
  Put<int32_t>(&v, value);
  AddKv(key, ValueType::kInt32, std::move(v));
}

void GgufWriter::AddFloat32(const std::string& key, float value) {
  std::string v;
  Put<float>(&v, value);
  AddKv(key, ValueType::kFloat32, std::move(v));
}

void GgufWriter::AddBool(const std::string& key, bool value) {
  std::string v;
  Put<uint8_t>(&v, value ? 1 : 0);
  AddKv(key, ValueType::kBool, std::move(v));
}

void GgufWriter::AddStringArray(const std::string& key, const std::vector<std::string>& values) {
  std::string v;
  Put<uint32_t>(&v, static_cast<uint32_t>(ValueType::kString));
  Put<uint64_t>(&v, values.size());
  for (const std::string& s : values) PutString(&v, s);
  AddKv(key, ValueType::kArray, std::move(v));
}

void GgufWriter::AddInt32Array(const std::string& key, const std::vector<int32_t>& values) {
  std::string v;
  Put<uint32_t>(&v, static_cast<uint32_t>(ValueType::kInt32));
  Put<uint64_t>(&v, values.size());
  for (int32_t x : values) Put<int32_t>(&v, x);
  AddKv(key, ValueType::kArray, std::move(v));
}

absl::Status GgufWriter::AddTensor(const std::string& name, const std::vector<int64_t>& dims,
                                   TensorType type, const void* data, size_t nbytes) {
  if (name.empty() || name.size() >= 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor name '", name, "' must have 1..63 bytes"));
  }
  if (dims.empty() || dims.size() > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, ": 1..4 dims, not ", dims.size()));
  }
  uint64_t n = 1;
  for (int64_t d : dims) {
    if (d < 1 || d > (int64_t{1} << 40)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": bad dim ", d));
    }
    n *= static_cast<uint64_t>(d);
    if (n > (uint64_t{1} << 40))
      return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " too large"));
  }
  if (n * TensorTypeSize(type) != nbytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": ", nbytes, " bytes for ", n,
                                                   " elements of ", TensorTypeSize(type),
                                                   " bytes"));
  }
  if (!tensor_names_.insert(name).second) {
    return absl::InvalidArgumentError(absl::StrCat("duplicate tensor ", name));
  }
  tensors_.push_back({name, dims, type, std::string(static_cast<const char*>(data), nbytes)});
  return absl::OkStatus();
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  if (!key_error_.empty()) return absl::InvalidArgumentError(key_error_);
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("alignment ", alignment_, " is not a power of 2"));
  }
  std::string head;
  head.append("GGUF", 4);
  Put<uint32_t>(&head, kVersion);
  Put<uint64_t>(&head, tensors_.size());
  Put<uint64_t>(&head, kvs_.size() + 1);
  PutString(&head, "general.alignment");
  Put<uint32_t>(&head, static_cast<uint32_t>(ValueType::kUint32));
  Put<uint32_t>(&head, alignment_);
  for (const std::string& kv : kvs_) head += kv;
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    PutString(&head, t.name);
    Put<uint32_t>(&head, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Put<uint64_t>(&head, static_cast<uint64_t>(d));
    Put<uint32_t>(&head, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&head, offset);
    offset = AlignUp(offset + t.bytes.size(), alignment_);
  }
  head.resize(AlignUp(head.size(), alignment_), '\0');

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp));
    out.write(head.data(), static_cast<std::streamsize>(head.size()));
    const std::string zeros(alignment_, '\0');
    for (const Tensor& t : tensors_) {
      out.write(t.bytes.data(), static_cast<std::streamsize>(t.bytes.size()));
      const uint64_t pad = AlignUp(t.bytes.size(), alignment_) - t.bytes.size();
      out.write(zeros.data(), static_cast<std::streamsize>(pad));
    }
    out.flush();
    if (!out) return absl::DataLossError(absl::StrCat("write failed: ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    return absl::PermissionDeniedError(
        absl::StrCat("rename ", tmp, " -> ", path, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace infoflow::gguf
