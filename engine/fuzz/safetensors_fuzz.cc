// libFuzzer target for SafetensorsFile::ParseHeader: arbitrary bytes as the
// JSON header, checked against several data-section sizes. Besides "no crash,
// no sanitizer report", it checks ParseHeader's contract on success: every
// tensor lies inside the data section, has the byte size its shape and dtype
// imply, and tensors come sorted by name.
//
// Not part of any library (engine/fuzz/ is outside the engine glob); built
// only with INFOFLOW_FUZZ=ON and clang.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "engine/checkpoint/safetensors.h"

namespace {

void CheckContract(const infoflow::SafetensorsHeader& h, uint64_t data_size) {
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const infoflow::TensorInfo& t = h.tensors[i];
    if (t.data != nullptr) std::abort();
    if (t.offset > data_size || t.nbytes > data_size - t.offset) std::abort();
    uint64_t n = infoflow::DTypeSize(t.dtype);
    bool zero = false;
    for (int64_t d : t.shape) {
      if (d < 0) std::abort();
      if (d == 0) zero = true;
    }
    if (!zero) {
      for (int64_t d : t.shape) {
        if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
          std::abort();  // Accepted a size that does not fit.
        }
      }
      if (n != t.nbytes) std::abort();
    } else if (t.nbytes != 0) {
      std::abort();
    }
    if (i > 0 && !(h.tensors[i - 1].name < t.name)) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view header(reinterpret_cast<const char*>(data), size);
  for (uint64_t data_size :
       {uint64_t{0}, uint64_t{1} << 16, std::numeric_limits<uint64_t>::max()}) {
    absl::StatusOr<infoflow::SafetensorsHeader> h =
        infoflow::SafetensorsFile::ParseHeader(header, data_size);
    if (h.ok()) CheckContract(*h, data_size);
  }
  return 0;
}
