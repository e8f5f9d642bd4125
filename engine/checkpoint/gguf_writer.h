// A writer for GGUF version 3 files (the model format of llama.cpp / ggml),
// written from the GGUF specification, torch-free.
//
// Layout written (all integers little-endian):
//   "GGUF" magic, uint32 version = 3, uint64 tensor count, uint64 KV count;
//   the metadata KVs in the order added: a string key (uint64 length + bytes),
//   a uint32 value type, the value (arrays: uint32 element type, uint64
//   count, the elements);
//   the tensor infos in the order added: string name, uint32 n_dims, n_dims
//   uint64 dims (ggml order: dims[0] is the contiguous one), uint32 ggml type,
//   uint64 offset into the data section;
//   zero padding to `alignment`; the data section: each tensor's bytes at its
//   offset, every offset a multiple of `alignment`, zero padding between.
// "general.alignment" (uint32) is written as the first KV, so readers that
// honour it and readers that assume the default 32 agree whenever alignment
// is 32.
//
// Not thread-safe; one writer builds one file.
#ifndef INFOFLOW_ENGINE_CHECKPOINT_GGUF_WRITER_H_
#define INFOFLOW_ENGINE_CHECKPOINT_GGUF_WRITER_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace infoflow::gguf {

// GGUF metadata value types (the spec's gguf_metadata_value_type).
enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// The ggml tensor types this writer emits (ggml_type values).
enum class TensorType : uint32_t {
  kF32 = 0,
  kF16 = 1,
};

// Bytes per element of `type`.
size_t TensorTypeSize(TensorType type);

inline constexpr uint32_t kVersion = 3;
inline constexpr uint32_t kDefaultAlignment = 32;

class GgufWriter {
 public:
  // `alignment` must be a power of two (checked by WriteFile).
  explicit GgufWriter(uint32_t alignment = kDefaultAlignment);

  // Metadata. Keys must be unique, non-empty and not "general.alignment"
  // (the writer owns it); a violation is reported by WriteFile.
  void AddString(const std::string& key, const std::string& value);
  void AddUint32(const std::string& key, uint32_t value);
  void AddInt32(const std::string& key, int32_t value);
  void AddFloat32(const std::string& key, float value);
  void AddBool(const std::string& key, bool value);
  void AddStringArray(const std::string& key, const std::vector<std::string>& values);
  void AddInt32Array(const std::string& key, const std::vector<int32_t>& values);

  // A tensor of shape `dims` (ggml order, dims[0] contiguous; 1..4 dims, each
  // >= 1) holding `data` (product(dims) * TensorTypeSize(type) bytes, copied).
  // InvalidArgument for an empty or repeated name (longer than 64 bytes is
  // refused too: ggml's GGML_MAX_NAME), a bad shape, or a size mismatch.
  absl::Status AddTensor(const std::string& name, const std::vector<int64_t>& dims, TensorType type,
                         const void* data, size_t nbytes);

  // Writes the file to `path` (a temporary file renamed into place, so a
  // reader never sees a partial file). InvalidArgument for the metadata
  // errors above or a bad alignment; an I/O error naming the path otherwise.
  absl::Status WriteFile(const std::string& path) const;

  size_t num_tensors() const { return tensors_.size(); }
  size_t num_kvs() const { return kvs_.size() + 1; }  // + general.alignment

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> dims;
    TensorType type;
    std::string bytes;
  };
  void AddKv(const std::string& key, ValueType type, std::string encoded_value);

  uint32_t alignment_;
  std::vector<std::string> kvs_;  // Each fully encoded: key, type, value.
  std::set<std::string> keys_;
  std::string key_error_;  // First metadata error, reported by WriteFile.
  std::vector<Tensor> tensors_;
  std::set<std::string> tensor_names_;
};

}  // namespace infoflow::gguf

#endif  // INFOFLOW_ENGINE_CHECKPOINT_GGUF_WRITER_H_
