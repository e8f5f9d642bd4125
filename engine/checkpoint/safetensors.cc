#include "engine/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace infoflow {
namespace {

using json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we, which
// also bounds what a hostile file can make us allocate.
constexpr uint64_t kMaxHeaderSize = 100u << 20;

struct DTypeEntry {
  DType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {DType::kBool, "BOOL", 1}, {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},     {DType::kU16, "U16", 2},
    {DType::kI16, "I16", 2},   {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kU32, "U32", 4},
    {DType::kI32, "I32", 4},   {DType::kF32, "F32", 4},
    {DType::kU64, "U64", 8},   {DType::kI64, "I64", 8},
    {DType::kF64, "F64", 8},
};

const DTypeEntry& Entry(DType dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == dtype) return e;
  }
  return kDTypes[0];  // Unreachable for valid enum values.
}

// a * b into *out; false on uint64 overflow.
bool MulOverflow(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

uint64_t ReadLE64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Debian's abseil has its own string_view, which StrCat needs.
absl::string_view Sv(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

std::string ErrnoText() { return std::strerror(errno); }

// `data_start` is where the data section begins in the file, or 0 when
// validating a bare header; it only changes the wording of offset errors so
// that a truncated file is reported in file terms.
absl::StatusOr<SafetensorsHeader> ParseHeaderImpl(std::string_view header_json,
                                                  uint64_t data_size,
                                                  uint64_t data_start,
                                                  bool in_file) {
  json root;
  try {
    root = json::parse(header_json.begin(), header_json.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("header is a JSON ", root.type_name(),
                     ", expected an object"));
  }
  SafetensorsHeader out;
  out.tensors.reserve(root.size());
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      if (entry.is_null()) continue;
      if (!entry.is_object()) {
        return absl::InvalidArgumentError("__metadata__ is not an object");
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "__metadata__ value for '", key, "' is not a string"));
        }
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = absl::StrCat("tensor '", name, "'");
    if (!entry.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": entry is not an object"));
    }
    TensorInfo info;
    info.name = name;

    auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": missing or non-string \"dtype\""));
    }
    absl::StatusOr<DType> dtype =
        ParseDType(dtype_it->get_ref<const std::string&>());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", dtype.status().message()));
    }
    info.dtype = *dtype;

    auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": missing or non-array \"shape\""));
    }
    uint64_t n_elems = 1;
    bool elems_overflow = false;
    for (const json& dim : *shape_it) {
      if (!dim.is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": shape entry ", dim.dump(),
                         " is not an integer"));
      }
      if (!dim.is_number_unsigned()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": negative dimension ", dim.dump()));
      }
      const uint64_t d = dim.get<uint64_t>();
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": dimension ", d, " is too large"));
      }
      info.shape.push_back(static_cast<int64_t>(d));
      if (MulOverflow(n_elems, d, &n_elems)) elems_overflow = true;
    }
    uint64_t expected_bytes = 0;
    // A zero dimension anywhere makes the product 0 even if a prefix
    // overflowed.
    const bool has_zero =
        std::find(info.shape.begin(), info.shape.end(), 0) != info.shape.end();
    if (has_zero) {
      n_elems = 0;
      elems_overflow = false;
    }
    if (elems_overflow ||
        MulOverflow(n_elems, DTypeSize(info.dtype), &expected_bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": shape size overflows"));
    }

    auto offs_it = entry.find("data_offsets");
    if (offs_it == entry.end() || !offs_it->is_array() ||
        offs_it->size() != 2 || !(*offs_it)[0].is_number_unsigned() ||
        !(*offs_it)[1].is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": \"data_offsets\" must be two non-negative integers"));
    }
    const uint64_t begin = (*offs_it)[0].get<uint64_t>();
    const uint64_t end = (*offs_it)[1].get<uint64_t>();
    if (begin > end) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": data_offsets [", begin, ", ", end, "] are reversed"));
    }
    if (end > data_size) {
      if (in_file) {
        // Neither sum can overflow meaningfully for real files; saturate for
        // hostile ones so the message stays sane.
        const uint64_t file_end =
            end > std::numeric_limits<uint64_t>::max() - data_start
                ? std::numeric_limits<uint64_t>::max()
                : data_start + end;
        return absl::DataLossError(absl::StrCat(
            "file is ", data_start + data_size, " bytes but header says ",
            where, " ends at ", file_end, " (truncated file?)"));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("data section is ", data_size, " bytes but header says ",
                       where, " ends at ", end));
    }
    if (end - begin != expected_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": data_offsets span ", end - begin, " bytes but shape and ",
          DTypeName(info.dtype), " need ", expected_bytes));
    }
    if (expected_bytes > std::numeric_limits<size_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": too large for this platform"));
    }
    info.offset = begin;
    info.nbytes = static_cast<size_t>(expected_bytes);
    out.tensors.push_back(std::move(info));
  }
  // json objects iterate in key order already; sort anyway so the contract
  // does not depend on nlohmann's container choice.
  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return a.name < b.name;
            });
  return out;
}

const TensorInfo* FindSorted(const std::vector<TensorInfo>& tensors,
                             std::string_view name) {
  auto it = std::lower_bound(
      tensors.begin(), tensors.end(), name,
      [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  if (it == tensors.end() || it->name != name) return nullptr;
  return &*it;
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", path, ": ", ErrnoText()));
  }
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return absl::DataLossError(absl::StrCat("error reading ", path));
  return out;
}

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

// ---------------------------------------------------------------- DType

size_t DTypeSize(DType dtype) { return Entry(dtype).size; }

const char* DTypeName(DType dtype) { return Entry(dtype).name; }

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (name == e.name) return e.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", Sv(name), "\""));
}

int64_t TensorInfo::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------- File

absl::StatusOr<SafetensorsHeader> SafetensorsFile::ParseHeader(
    std::string_view header_json, uint64_t data_size) {
  return ParseHeaderImpl(header_json, data_size, 0, /*in_file=*/false);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string msg = absl::StrCat("cannot open ", path, ": ",
                                   std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(msg);
    return absl::PermissionDeniedError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string msg = absl::StrCat("cannot stat ", path, ": ", ErrnoText());
    ::close(fd);
    return absl::InternalError(msg);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a regular file"));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(
        path, ": file is ", file_size,
        " bytes, too short for the 8-byte header length"));
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // The mapping keeps the file alive.
  if (map == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot mmap ", path, ": ",
                                            std::strerror(map_errno)));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_ = map;
  file->size_ = file_size;

  const uint8_t* base = static_cast<const uint8_t*>(map);
  const uint64_t header_size = ReadLE64(base);
  if (header_size > file_size - 8 || header_size > kMaxHeaderSize) {
    return absl::DataLossError(absl::StrCat(
        path, ": header length ", header_size, " is impossible for a file of ",
        file_size, " bytes (truncated or not a safetensors file?)"));
  }
  const uint64_t data_start = 8 + header_size;
  absl::StatusOr<SafetensorsHeader> header = ParseHeaderImpl(
      std::string_view(reinterpret_cast<const char*>(base + 8), header_size),
      file_size - data_start, data_start, /*in_file=*/true);
  if (!header.ok()) {
    return absl::Status(header.status().code(),
                        absl::StrCat(path, ": ", header.status().message()));
  }
  for (TensorInfo& t : header->tensors) {
    t.data = base + data_start + t.offset;
  }
  file->tensors_ = std::move(header->tensors);
  file->metadata_ = std::move(header->metadata);
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  return FindSorted(tensors_, name);
}

std::vector<std::string> SafetensorsFile::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const TensorInfo& t : tensors_) names.push_back(t.name);
  return names;
}

// ---------------------------------------------------------------- Model

absl::StatusOr<std::unique_ptr<SafetensorsModel>> SafetensorsModel::Open(
    const std::string& path) {
  std::unique_ptr<SafetensorsModel> model(new SafetensorsModel());
  model->path_ = path;

  auto add_single = [&](const std::string& file_path) -> absl::Status {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
        SafetensorsFile::Open(file_path);
    if (!file.ok()) return file.status();
    for (const TensorInfo& t : (*file)->tensors()) model->index_[t.name] = &t;
    model->files_.push_back(std::move(*file));
    return absl::OkStatus();
  };

  if (!IsDirectory(path)) {
    if (!IsRegularFile(path)) {
      return absl::NotFoundError(
          absl::StrCat("model path ", path, " does not exist"));
    }
    absl::Status s = add_single(path);
    if (!s.ok()) return s;
    return model;
  }

  const std::string single = path + "/model.safetensors";
  if (IsRegularFile(single)) {
    absl::Status s = add_single(single);
    if (!s.ok()) return s;
    return model;
  }
  const std::string index_path = path + "/model.safetensors.index.json";
  if (!IsRegularFile(index_path)) {
    return absl::NotFoundError(
        absl::StrCat("model directory ", path,
                     " has neither model.safetensors nor "
                     "model.safetensors.index.json"));
  }
  absl::StatusOr<std::string> index_text = ReadSmallFile(index_path);
  if (!index_text.ok()) return index_text.status();
  json index;
  try {
    index = json::parse(*index_text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": not valid JSON: ", e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": missing object \"weight_map\""));
  }
  const json& weight_map = index["weight_map"];
  // Open each shard once, in sorted order for determinism.
  std::map<std::string, const SafetensorsFile*> shards;
  for (const auto& [name, file] : weight_map.items()) {
    if (!file.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          index_path, ": weight_map entry for '", name, "' is not a string"));
    }
    const std::string& shard = file.get_ref<const std::string&>();
    if (shard.empty() || shard.find('/') != std::string::npos ||
        shard == "." || shard == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": weight_map entry for '", name,
                       "' names an invalid shard \"", shard, "\""));
    }
    shards.emplace(shard, nullptr);
  }
  for (auto& [shard, file_ptr] : shards) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
        SafetensorsFile::Open(path + "/" + shard);
    if (!file.ok()) {
      return absl::Status(
          file.status().code(),
          absl::StrCat(file.status().message(), " (shard listed in ",
                       index_path, ")"));
    }
    file_ptr = file->get();
    model->files_.push_back(std::move(*file));
  }
  for (const auto& [name, file] : weight_map.items()) {
    const SafetensorsFile* shard = shards[file.get<std::string>()];
    const TensorInfo* t = shard->Find(name);
    if (t == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          index_path, " maps tensor '", name, "' to ", shard->path(),
          " but that file has no such tensor"));
    }
    model->index_[name] = t;
  }
  return model;
}

const TensorInfo* SafetensorsModel::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

absl::StatusOr<const TensorInfo*> SafetensorsModel::Get(
    std::string_view name) const {
  const TensorInfo* t = Find(name);
  if (t == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("tensor '", Sv(name), "' not found in ", path_));
  }
  return t;
}

std::vector<std::string> SafetensorsModel::Names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, t] : index_) names.push_back(name);
  return names;
}

// ---------------------------------------------------------------- Writer

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorToWrite*> sorted;
  sorted.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) {
              return a->name < b->name;
            });

  std::vector<uint64_t> sizes;
  sizes.reserve(sorted.size());
  std::string header = "{";
  // json::dump throws on names or metadata that are not valid UTF-8.
  try {
  bool first = true;
  if (!metadata.empty()) {
    json meta = json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header += "\"__metadata__\":" + meta.dump();
    first = false;
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const TensorToWrite& t = *sorted[i];
    if (t.name.empty() || t.name == "__metadata__") {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid tensor name \"", t.name, "\""));
    }
    if (i > 0 && sorted[i - 1]->name == t.name) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate tensor name \"", t.name, "\""));
    }
    uint64_t n = DTypeSize(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", t.name, "' has negative dimension ", d));
      }
      if (MulOverflow(n, static_cast<uint64_t>(d), &n)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", t.name, "' is too large"));
      }
    }
    if (n > 0 && t.data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "' has no data"));
    }
    json shape = json::array();
    for (int64_t d : t.shape) shape.push_back(d);
    if (!first) header += ",";
    first = false;
    header += absl::StrCat(json(t.name).dump(), ":{\"dtype\":\"",
                           DTypeName(t.dtype), "\",\"shape\":", shape.dump(),
                           ",\"data_offsets\":[", offset, ",", offset + n,
                           "]}");
    offset += n;
    sizes.push_back(n);
  }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot encode header for ", path, ": ", e.what()));
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';

  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", tmp, ": ", ErrnoText()));
  }
  uint8_t len[8];
  uint64_t hs = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(hs >> (8 * i));
  bool ok = WriteAll(fd, len, 8) && WriteAll(fd, header.data(), header.size());
  for (size_t i = 0; ok && i < sorted.size(); ++i) {
    if (sizes[i] > 0) ok = WriteAll(fd, sorted[i]->data, sizes[i]);
  }
  if (!ok) {
    std::string msg = absl::StrCat("error writing ", tmp, ": ", ErrnoText());
    ::close(fd);
    ::unlink(tmp.c_str());
    return absl::InternalError(msg);
  }
  if (::close(fd) != 0) {
    std::string msg = absl::StrCat("error closing ", tmp, ": ", ErrnoText());
    ::unlink(tmp.c_str());
    return absl::InternalError(msg);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string msg = absl::StrCat("cannot rename ", tmp, " to ", path, ": ",
                                   ErrnoText());
    ::unlink(tmp.c_str());
    return absl::InternalError(msg);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- Convert

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // Inf or NaN (payload kept).
  } else if (exp != 0) {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // Signed zero.
  } else {
    // Subnormal: value = mant * 2^-24. Normalize.
    int e = -14;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    mant &= 0x3FFu;
    bits = sign | (static_cast<uint32_t>(e + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float BF16ToF32(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t F32ToBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // Quiet NaN.
  }
  const uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

uint16_t F32ToF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) {
    return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  }
  if (abs == 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u);
  const int exp = static_cast<int>(abs >> 23) - 127;
  if (exp > 15) return static_cast<uint16_t>(sign | 0x7C00u);  // Overflow.
  uint32_t mant = (abs & 0x7FFFFFu);
  if (exp >= -14) {
    // Normal half: keep 10 of 23 mantissa bits, round to nearest even. A
    // carry out of the mantissa correctly bumps the exponent (even to inf).
    uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  if (exp < -25) return sign;  // Below half the smallest subnormal.
  // Subnormal half: value = m * 2^-24 with m = full_mant * 2^(exp+1) / 2^0.
  mant |= 0x800000u;  // Implicit leading 1.
  const int shift = -exp - 14 + 13;  // 14..25 -> bits to drop.
  uint32_t h = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

void ConvertToF32(DType src_dtype, const uint8_t* src, size_t n_elems,
                  float* dst) {
  auto convert = [&](auto tag, auto fn) {
    using T = decltype(tag);
    for (size_t i = 0; i < n_elems; ++i) {
      T v;
      std::memcpy(&v, src + i * sizeof(T), sizeof(T));
      dst[i] = fn(v);
    }
  };
  auto cast = [](auto v) { return static_cast<float>(v); };
  switch (src_dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n_elems * 4);
      return;
    case DType::kF16:
      convert(uint16_t{}, F16ToF32);
      return;
    case DType::kBF16:
      convert(uint16_t{}, BF16ToF32);
      return;
    case DType::kF64:
      convert(double{}, cast);
      return;
    case DType::kBool:
      convert(uint8_t{}, [](uint8_t v) { return v != 0 ? 1.0f : 0.0f; });
      return;
    case DType::kU8:
      convert(uint8_t{}, cast);
      return;
    case DType::kI8:
      convert(int8_t{}, cast);
      return;
    case DType::kU16:
      convert(uint16_t{}, cast);
      return;
    case DType::kI16:
      convert(int16_t{}, cast);
      return;
    case DType::kU32:
      convert(uint32_t{}, cast);
      return;
    case DType::kI32:
      convert(int32_t{}, cast);
      return;
    case DType::kU64:
      convert(uint64_t{}, cast);
      return;
    case DType::kI64:
      convert(int64_t{}, cast);
      return;
  }
}

}  // namespace infoflow
