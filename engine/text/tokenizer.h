// Tokenizer: text <-> token ids for the models we serve, loaded from a
// Hugging Face `tokenizer.json`.
//
// Supported (anything else makes FromFile/FromJsonString fail with
// Unimplemented or InvalidArgument, never silently mis-tokenize):
//  - model: "BPE" with vocab, merges as "a b" strings or ["a","b"] arrays
//    (rank = position), unk_token, fuse_unk, byte_fallback (<0xNN> tokens),
//    ignore_merges. continuing_subword_prefix / end_of_word_suffix must be
//    empty; dropout must be null or 0.
//  - normalizer: null, Sequence, NFC (full implementation, tables from the
//    Unicode 14 database), Prepend, Replace (String or Regex pattern).
//  - pre_tokenizer: null, Sequence, Split (Regex or String pattern; behavior
//    Isolated or Removed; invert false), ByteLevel (add_prefix_space,
//    use_regex with the GPT-2 regex), Metaspace (replacement,
//    prepend_scheme / add_prefix_space, split), Digits.
//    Regexes are run with RE2 after translation (see tokenizer_regex.h),
//    including the `\s+(?!\S)` lookahead of GPT-2/Llama-3/Qwen patterns.
//  - decoder: ByteLevel, Sequence, Replace (String), ByteFallback, Fuse,
//    Strip (leading spaces only), Metaspace.
//  - post_processor: TemplateProcessing (the "single" template: special
//    tokens before and after $A), Sequence, ByteLevel/Roberta/Bert (no-ops
//    for our purposes: they add nothing).
//  - added_tokens: matched verbatim in the raw input (longest match first,
//    left to right) before normalization, whatever their `normalized`,
//    `lstrip`, `rstrip`, `single_word` flags say (those are ignored). Those
//    flagged "special" only where the caller allows it (EncodePieces).
//
// A Tokenizer is immutable after construction except for an internal,
// mutex-protected cache of encoded words, so Encode/Decode and all accessors
// are safe to call concurrently from many threads.
#ifndef INFOFLOW_ENGINE_TEXT_TOKENIZER_H_
#define INFOFLOW_ENGINE_TEXT_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace infoflow {

class RegexSplitter;

class Tokenizer {
 public:
  // Loads the tokenizer.json at `path`. Errors: NotFound if the file cannot
  // be read, InvalidArgument for malformed JSON or contents, Unimplemented
  // for components this class does not support (see file comment).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  // Same as FromFile, from the text of a tokenizer.json.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJsonString(std::string_view json);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Encodes UTF-8 `text` (invalid bytes are treated as U+FFFD). Added tokens
  // that occur verbatim in `text` become their ids. If `add_special`, the
  // special tokens of the file's post_processor template are added around
  // the result (Llama-2: BOS in front; Llama-3/Qwen files as shipped add
  // nothing). Never fails: a character with no token and no byte fallback
  // becomes unk_token, or is dropped if the model has none.
  std::vector<int32_t> Encode(std::string_view text, bool add_special = false) const;

  // A span of text to encode, and whether the *special* added tokens in it
  // (flagged "special" in the file: <|im_start|>, <|eot_id|>, <s>, ...)
  // become their single ids. With parse_special false such a spelling is
  // encoded as the plain text it is (so text from users cannot inject control
  // tokens); non-special added tokens are matched either way, as Hugging
  // Face tokenizers does with split_special_tokens.
  struct Piece {
    std::string_view text;
    bool parse_special = true;
  };

  // Encodes the concatenation of `pieces` (no post_processor tokens). An
  // added token is matched only inside one piece; the plain text between two
  // matched tokens is encoded as one run even where it crosses piece
  // boundaries, so a template and the question substituted into it tokenize
  // exactly as their joined text would (when nothing is matched differently).
  // EncodePieces({{text, true}}) == Encode(text).
  std::vector<int32_t> EncodePieces(const std::vector<Piece>& pieces) const;

  // Decodes `ids` to UTF-8 text, running the file's decoder. Special
  // tokens decode to their content unless `skip_special`. Ids out of range
  // are skipped. Byte sequences that are not valid UTF-8 become U+FFFD
  // (one per maximal invalid subpart), so the result is always valid UTF-8.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  // Number of ids: one more than the largest id in vocab or added_tokens.
  int vocab_size() const { return static_cast<int>(id_to_token_.size()); }
  // Id of the token spelled `token` exactly as in the file (e.g. "Ġthe",
  // "▁the", "<|im_start|>"), or nullopt.
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // Spelling of `id` as in the file; empty for ids out of range or unused.
  std::string IdToToken(int32_t id) const;
  // True if `id` is an added token flagged "special" in the file.
  bool IsSpecial(int32_t id) const;
  // Ids that post_processor adds before/after the text when add_special.
  const std::vector<int32_t>& prefix_special_ids() const { return prefix_ids_; }
  const std::vector<int32_t>& suffix_special_ids() const { return suffix_ids_; }

 private:
  friend class StreamingDecoder;
  struct Impl;
  Tokenizer();

  // The raw bytes token `id` contributes to decoded text before the decoder's
  // leading-space strip and UTF-8 repair; empty for skipped/unknown ids.
  const std::string& DecodedBytes(int32_t id, bool skip_special) const;
  // How many leading ' ' the decoder strips from the whole output.
  int strip_leading_spaces() const { return strip_leading_; }

  void EncodePiecesInto(const std::vector<Piece>& pieces, std::vector<int32_t>* out) const;
  void EncodeSegment(std::string_view segment, std::vector<int32_t>* out) const;
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  void BpeWord(std::string_view word, std::vector<int32_t>* out) const;

  std::unique_ptr<Impl> impl_;
  std::vector<std::string> id_to_token_;
  std::vector<std::string> id_bytes_;  // DecodedBytes for each id
  std::vector<bool> special_;
  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  std::vector<int32_t> prefix_ids_, suffix_ids_;
  int strip_leading_ = 0;

  // Word cache for byte-level models (keys are raw word bytes).
  mutable std::mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_;
};

// Turns a stream of generated ids into text that is safe to print as it
// arrives: Push never returns part of a UTF-8 character (incomplete bytes
// are held back until completed) and applies the decoder's leading-space
// strip exactly as Decode does. For any id sequence,
// concat(Push(id_1), ..., Push(id_n), Flush()) == Decode({id_1..id_n}).
// Not thread-safe; the Tokenizer must outlive it.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer* tokenizer, bool skip_special = false);

  // Adds one id; returns the text that became printable (possibly empty).
  std::string Push(int32_t id);
  // Returns the remaining held-back bytes, invalid ones as U+FFFD, and resets
  // the decoder to its initial state.
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes not yet returned (an incomplete character)
  int strip_left_;       // leading spaces still to strip; 0 once text began
};

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_TEXT_TOKENIZER_H_
