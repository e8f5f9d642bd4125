// Pre-tokenizer regexes from Hugging Face tokenizer.json files, run with RE2.
//
// The files' regexes are written for Oniguruma / fancy-regex: `\s` means
// Unicode White_Space and they use the lookahead `\s+(?!\S)`. RE2 has
// neither, so the pattern is translated:
//  - `\s` / `\S` become explicit White_Space classes;
//  - capturing groups become non-capturing;
//  - the alternative `\s+(?!\S)` becomes a capturing `(\s+)` whose match is
//    fixed up in code: a whitespace run that is followed by a non-space
//    character gives its last character back (a run of one character then
//    matches the next alternative, which in every known pattern is `\s+`,
//    i.e. the same single character).
// Any other lookaround or backreference is rejected with an error.
// A RegexSplitter is immutable after construction and safe to share.
#ifndef INFOFLOW_ENGINE_TEXT_TOKENIZER_REGEX_H_
#define INFOFLOW_ENGINE_TEXT_TOKENIZER_REGEX_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace re2 {
class RE2;
}

namespace infoflow {

// The regex GPT-2's ByteLevel pre-tokenizer uses (use_regex = true).
extern const char kGpt2SplitPattern[];

class RegexSplitter {
 public:
  // Translates and compiles `pattern`. Errors: InvalidArgument if RE2 cannot
  // compile the translation, Unimplemented for lookaround other than the
  // `\s+(?!\S)` alternative.
  static absl::StatusOr<std::unique_ptr<RegexSplitter>> Create(std::string_view pattern);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Returns the [begin, end) byte ranges of the non-overlapping, non-empty
  // matches in `text`, left to right.
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;

  // "Isolated" split: matches and the gaps between them, in order, as pieces
  // of `text` (no empty pieces). With `drop_matches` ("Removed"), only gaps.
  std::vector<std::string_view> Split(std::string_view text, bool drop_matches = false) const;

  // The RE2 pattern actually compiled (for tests and error messages).
  const std::string& translated() const { return translated_; }

  // Translates a tokenizer.json regex into RE2 syntax (see file comment).
  // *lookahead_group is set when the `\s+(?!\S)` alternative was found.
  static absl::StatusOr<std::string> Translate(std::string_view pattern, bool* lookahead_group);

 private:
  RegexSplitter() = default;

  std::unique_ptr<re2::RE2> re_;
  std::string translated_;
  bool lookahead_group_ = false;
};

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_TEXT_TOKENIZER_REGEX_H_
