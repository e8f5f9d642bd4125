// Reading and writing Hugging Face safetensors checkpoints, torch-free.
//
// A safetensors file is: an 8-byte little-endian header length N, N bytes of
// JSON ({"tensor name": {"dtype": "F32", "shape": [..], "data_offsets":
// [begin, end]}, ..., optional "__metadata__": {string: string}}), then the
// raw little-endian tensor bytes. Offsets are relative to the start of the
// data section (byte 8 + N of the file).
//
// SafetensorsFile memory-maps one file read-only; SafetensorsModel opens a
// model directory (one file or a sharded index). Both are immutable after
// Open() and therefore safe for concurrent use from multiple threads.

#ifndef INFOFLOW_ENGINE_CHECKPOINT_SAFETENSORS_H_
#define INFOFLOW_ENGINE_CHECKPOINT_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace infoflow {

// Element types of the safetensors format. Names in files are the upper-case
// spellings ("F32", "BF16", ...).
enum class DType {
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kF16,
  kBF16,
  kU32,
  kI32,
  kF32,
  kU64,
  kI64,
  kF64,
};

// Bytes per element of `dtype` (1, 2, 4 or 8).
size_t DTypeSize(DType dtype);

// The safetensors spelling of `dtype`, e.g. "BF16". Static storage; a plain
// C string so that it works with absl::StrCat (Debian's abseil does not take
// std::string_view).
const char* DTypeName(DType dtype);

// Parses a safetensors dtype name ("F32", "F16", "BF16", "I64", ...; exact,
// case-sensitive). Returns InvalidArgument naming the string if unknown.
absl::StatusOr<DType> ParseDType(std::string_view name);

// One tensor inside a mapped file.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // Empty for a scalar.
  // Points into the read-only mapping owned by the SafetensorsFile; valid as
  // long as that file object lives. nullptr for headers produced by
  // ParseHeader(). NOT necessarily aligned to the element size: read it with
  // memcpy (ConvertToF32 does).
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  // Byte offset of the tensor within the data section.
  uint64_t offset = 0;

  // Product of `shape` (1 for a scalar).
  int64_t NumElements() const;
};

// The validated contents of a header.
struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // Sorted by name; data == nullptr.
  std::map<std::string, std::string> metadata;  // "__metadata__", if any.
};

// A read-only memory-mapped safetensors file. Not copyable. The file must not
// be truncated or rewritten in place while open (reads of a mapping past a
// shrunk file end raise SIGBUS); WriteSafetensors replaces files by rename,
// which is safe.
class SafetensorsFile {
 public:
  // Maps `path` and validates its header. On success returns the file. On
  // failure returns NotFound (cannot open), or InvalidArgument / DataLoss for
  // a malformed or truncated file; every message names the file and, where
  // one is at fault, the tensor.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);

  // Pure function: validates the JSON header `header_json` for a data
  // section of `data_size` bytes. Never throws and never reads outside its
  // arguments, for any input (fuzzed). Checks: the header is a JSON object;
  // each entry other than "__metadata__" has a known dtype, a shape of
  // non-negative integers, data_offsets [begin, end] with begin <= end <=
  // data_size and end - begin == product(shape) * DTypeSize(dtype), computed
  // without overflow. "__metadata__", if present, must map strings to
  // strings. Overlapping tensors are not rejected.
  static absl::StatusOr<SafetensorsHeader> ParseHeader(
      std::string_view header_json, uint64_t data_size);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Returns the tensor called `name`, or nullptr if the file has none. The
  // pointer is valid as long as this object lives.
  const TensorInfo* Find(std::string_view name) const;

  // Names of all tensors, sorted.
  std::vector<std::string> Names() const;

  // All tensors, sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  // The "__metadata__" map (empty if the file has none).
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }

  const std::string& path() const { return path_; }
  size_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;

  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The weights of a Hugging Face model directory: either `model.safetensors`
// or a sharded `model.safetensors.index.json` whose "weight_map" maps tensor
// names to shard files in the same directory. Not copyable.
class SafetensorsModel {
 public:
  // Opens `path`, which is a model directory or a single .safetensors file.
  // In a directory, model.safetensors is preferred over the index. Every
  // shard named by the index is opened and validated, and every tensor in
  // "weight_map" must exist in its shard. Errors name the file and tensor.
  static absl::StatusOr<std::unique_ptr<SafetensorsModel>> Open(
      const std::string& path);

  SafetensorsModel(const SafetensorsModel&) = delete;
  SafetensorsModel& operator=(const SafetensorsModel&) = delete;

  // Returns the tensor called `name` in whichever shard holds it, or nullptr.
  // Valid as long as this object lives.
  const TensorInfo* Find(std::string_view name) const;

  // Like Find(), but returns NotFound naming the tensor and model path.
  absl::StatusOr<const TensorInfo*> Get(std::string_view name) const;

  // Names of all tensors, sorted.
  std::vector<std::string> Names() const;

  // Number of shard files (1 when unsharded).
  size_t num_files() const { return files_.size(); }

  const std::string& path() const { return path_; }

 private:
  SafetensorsModel() = default;

  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*, std::less<>> index_;
};

// One tensor for WriteSafetensors. `data` holds NumElements * DTypeSize
// bytes in little-endian order; it may be nullptr only if that is zero.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes `tensors` to `path` in safetensors format. The output depends only
// on the arguments: "__metadata__" first (omitted when empty), then tensors
// sorted by name with data laid out in that order, compact JSON padded with
// spaces to a multiple of 8 bytes (as the Hugging Face writer does). Writes a
// temporary file and renames it, so readers never see a partial file.
// Returns InvalidArgument for empty or duplicate names or negative
// dimensions, and an I/O error naming the path if writing fails.
absl::Status WriteSafetensors(
    const std::string& path, const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata = {});

// Element conversions. F16 is IEEE 754 binary16 (subnormals, inf, NaN);
// BF16 is the upper half of an F32. The F32 -> 16-bit conversions round to
// nearest, ties to even; overflow gives inf, NaN stays NaN.
float F16ToF32(uint16_t h);
float BF16ToF32(uint16_t b);
uint16_t F32ToF16(float f);
uint16_t F32ToBF16(float f);

// Converts `n_elems` little-endian elements of type `src_dtype` at `src`
// (any alignment) to float at `dst`. Integer and F64 types are converted
// with static_cast (may lose precision); kBool gives 0 or 1.
void ConvertToF32(DType src_dtype, const uint8_t* src, size_t n_elems,
                  float* dst);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_CHECKPOINT_SAFETENSORS_H_
