// libFuzzer target: DecodeRecord must accept or reject any byte string
// without crashing, reading out of bounds or over-allocating; whatever it
// accepts must re-encode to exactly the same bytes (the format has no
// unchecked slack, so two encodings of one record cannot exist).
//
//   ./record_fuzz -max_len=4096 corpus_dir
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "cache_store/kv_record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using infoflow::store::DecodeRecord;
  using infoflow::store::EncodeRecord;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  for (bool verify : {true, false}) {
    infoflow::store::DecodeOptions options;
    options.verify_checksum = verify;
    auto rec = DecodeRecord(in, options);
    if (!rec.ok()) continue;
    // Touch every K/V byte the record claims, so ASan sees any overrun.
    volatile char sink = 0;
    for (uint32_t l = 0; l < rec->header.n_layers; ++l) {
      if (rec->k_bytes > 0) sink ^= rec->K(l)[rec->k_bytes - 1];
      if (rec->v_bytes > 0) sink ^= rec->V(l)[rec->v_bytes - 1];
    }
    (void)sink;
    if (verify) {
      auto again = EncodeRecord(rec->header, rec->token_ids, rec->payload);
      if (!again.ok() || *again != in) std::abort();
    }
  }
  return 0;
}
