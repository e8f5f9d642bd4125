// libFuzzer target for the tokenizer.json loader: arbitrary bytes go to
// Tokenizer::FromJsonString; whatever loads must then Encode and Decode a
// small fixed text and arbitrary ids without crashing, return valid UTF-8
// from Decode, and agree with StreamingDecoder (concat of Push + Flush ==
// Decode), as tokenizer.h promises.
//
// Not part of any library (engine/fuzz/ is outside the engine glob); built
// only with INFOFLOW_FUZZ=ON and clang (tests/fuzz/CMakeLists.txt).
//
//   ./tokenizer_fuzz -max_len=8192 -dict=... corpus_dir

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "engine/text/tokenizer.h"
#include "engine/text/unicode.h"

namespace {

bool ValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = infoflow::unicode::ValidSequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

void CheckDecode(const infoflow::Tokenizer& tok, const std::vector<int32_t>& ids) {
  for (bool skip : {false, true}) {
    const std::string text = tok.Decode(ids, skip);
    if (!ValidUtf8(text)) std::abort();
    infoflow::StreamingDecoder stream(&tok, skip);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.Push(id);
    streamed += stream.Flush();
    if (streamed != text) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  auto tok = infoflow::Tokenizer::FromJsonString(json);
  if (!tok.ok()) return 0;
  const infoflow::Tokenizer& t = **tok;
  for (std::string_view text : {std::string_view("Hello world, ab ab<x>!"),
                                std::string_view("  caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD 42\n"),
                                std::string_view("bad \xFF\xC0 bytes")}) {
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = t.Encode(text, special);
      for (int32_t id : ids) {
        if (id < 0 || id >= t.vocab_size()) std::abort();
      }
      CheckDecode(t, ids);
    }
  }
  // Every id (and a few out of range) decodes, alone and in a row.
  std::vector<int32_t> all;
  const int32_t n = t.vocab_size();
  for (int32_t id = -2; id < n + 2 && id < 4096; ++id) {
    all.push_back(id);
    (void)t.IdToToken(id);
    (void)t.IsSpecial(id);
  }
  CheckDecode(t, all);
  return 0;
}
