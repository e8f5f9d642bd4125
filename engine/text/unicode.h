// Small UTF-8 and Unicode helpers for the tokenizer: decoding/encoding code
// points, lossy repair of byte strings, and NFC normalization.
// All functions are pure and thread-safe.
#ifndef INFOFLOW_ENGINE_TEXT_UNICODE_H_
#define INFOFLOW_ENGINE_TEXT_UNICODE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace infoflow::unicode {

// Appends the UTF-8 encoding of `cp` (must be a valid scalar value) to *out.
void AppendUtf8(uint32_t cp, std::string* out);

// Length in bytes of the valid UTF-8 sequence starting at s[i], or 0 when the
// bytes there are not a complete, valid sequence (invalid lead byte, bad
// continuation, overlong form, surrogate, or truncated by the end of `s`).
size_t ValidSequenceLength(std::string_view s, size_t i);

// Decodes the code point at s[i] and advances *i. Invalid input yields
// U+FFFD and advances by the length of the maximal invalid subpart.
uint32_t NextCodePoint(std::string_view s, size_t* i);

// Repairs `bytes` into valid UTF-8: each maximal invalid subpart (the
// WHATWG / Rust from_utf8_lossy rule) becomes one U+FFFD.
// If `hold_incomplete_tail` is set, a trailing sequence that is a valid but
// unfinished prefix of a character is not converted: its length is stored in
// *held (the caller keeps those bytes for later), and the result covers only
// the bytes before it. With it unset, *held (if non-null) is set to 0.
std::string RepairUtf8(std::string_view bytes, bool hold_incomplete_tail = false,
                       size_t* held = nullptr);

// True for the Unicode White_Space property (what Rust's / Oniguruma's `\s`
// matches in the Hugging Face pre-tokenizer regexes).
bool IsWhiteSpace(uint32_t cp);

// Unicode Normalization Form C (canonical decomposition, canonical ordering,
// canonical composition, Hangul included) using tables generated from
// Python's unicodedata (see unicode_nfc_gen.py). Input must be valid UTF-8
// (invalid bytes are replaced by U+FFFD). Text that contains no character
// affected by NFC, e.g. all ASCII, is returned unchanged without work.
std::string NormalizeNfc(std::string_view s);

}  // namespace infoflow::unicode

#endif  // INFOFLOW_ENGINE_TEXT_UNICODE_H_
