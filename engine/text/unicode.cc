#include "engine/text/unicode.h"

#include <algorithm>
#include <vector>

#include "engine/text/unicode_nfc_data.h"

namespace infoflow::unicode {
namespace {

constexpr uint32_t kReplacement = 0xFFFD;

// Hangul syllables compose and decompose algorithmically (Unicode ch. 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// Examines the sequence at s[i]. Returns its length if valid and complete.
// Otherwise returns 0 and sets *prefix_len to the length of the maximal
// subpart (>= 1) and *truncated to whether the subpart is a valid prefix cut
// short only by the end of the input.
size_t Examine(std::string_view s, size_t i, size_t* prefix_len, bool* truncated) {
  const unsigned char b0 = static_cast<unsigned char>(s[i]);
  *truncated = false;
  *prefix_len = 1;
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the 2nd byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= s.size()) {
      *truncated = true;
      *prefix_len = k;
      return 0;
    }
    const unsigned char b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      *prefix_len = k;
      return 0;
    }
  }
  return need;
}

uint32_t DecodeValid(std::string_view s, size_t i, size_t len) {
  const unsigned char b0 = static_cast<unsigned char>(s[i]);
  if (len == 1) return b0;
  uint32_t cp = b0 & (0xFF >> (len + 1));
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

uint32_t CombiningClassOf(uint32_t cp) {
  if (cp < 0x300) return 0;
  const auto* begin = unicode_data::kCombiningClasses;
  const auto* end = begin + unicode_data::kCombiningClassesSize;
  const auto* it = std::lower_bound(begin, end, cp, [](const unicode_data::CombiningClass& e,
                                                       uint32_t v) { return e.cp < v; });
  return (it != end && it->cp == cp) ? it->ccc : 0;
}

const unicode_data::Decomposition* FindDecomposition(uint32_t cp) {
  if (cp < 0xC0) return nullptr;
  const auto* begin = unicode_data::kDecompositions;
  const auto* end = begin + unicode_data::kDecompositionsSize;
  const auto* it = std::lower_bound(begin, end, cp, [](const unicode_data::Decomposition& e,
                                                       uint32_t v) { return e.cp < v; });
  return (it != end && it->cp == cp) ? it : nullptr;
}

// Returns the primary composite of (a, b), or 0 if there is none.
uint32_t Compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto* begin = unicode_data::kCompositions;
  const auto* end = begin + unicode_data::kCompositionsSize;
  const auto* it = std::lower_bound(
      begin, end, std::make_pair(a, b), [](const unicode_data::Composition& e,
                                           const std::pair<uint32_t, uint32_t>& v) {
        return e.first < v.first || (e.first == v.first && e.second < v.second);
      });
  return (it != end && it->first == a && it->second == b) ? it->composite : 0;
}

// True if `cp` can appear as the second half of a composition (so NFC may
// change text containing it even though it has no decomposition).
bool IsComposableSecond(uint32_t cp) {
  if (cp >= kVBase && cp < kVBase + kVCount) return true;
  if (cp > kTBase && cp < kTBase + kTCount) return true;
  static const std::vector<uint32_t>* seconds = [] {
    auto* v = new std::vector<uint32_t>;
    for (int i = 0; i < unicode_data::kCompositionsSize; ++i) {
      v->push_back(unicode_data::kCompositions[i].second);
    }
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
    return v;
  }();
  return std::binary_search(seconds->begin(), seconds->end(), cp);
}

void DecomposeInto(uint32_t cp, std::vector<uint32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const unicode_data::Decomposition* d = FindDecomposition(cp);
  if (d == nullptr) {
    out->push_back(cp);
    return;
  }
  DecomposeInto(d->first, out);
  if (d->second != 0) DecomposeInto(d->second, out);
}

}  // namespace

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t ValidSequenceLength(std::string_view s, size_t i) {
  size_t prefix;
  bool truncated;
  return Examine(s, i, &prefix, &truncated);
}

uint32_t NextCodePoint(std::string_view s, size_t* i) {
  size_t prefix;
  bool truncated;
  const size_t len = Examine(s, *i, &prefix, &truncated);
  if (len == 0) {
    *i += prefix;
    return kReplacement;
  }
  const uint32_t cp = DecodeValid(s, *i, len);
  *i += len;
  return cp;
}

std::string RepairUtf8(std::string_view bytes, bool hold_incomplete_tail, size_t* held) {
  std::string out;
  out.reserve(bytes.size());
  if (held != nullptr) *held = 0;
  size_t i = 0;
  while (i < bytes.size()) {
    size_t prefix;
    bool truncated;
    const size_t len = Examine(bytes, i, &prefix, &truncated);
    if (len > 0) {
      out.append(bytes.data() + i, len);
      i += len;
      continue;
    }
    if (truncated && hold_incomplete_tail) {
      if (held != nullptr) *held = bytes.size() - i;
      break;
    }
    AppendUtf8(kReplacement, &out);
    i += prefix;
  }
  return out;
}

bool IsWhiteSpace(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string NormalizeNfc(std::string_view s) {
  // Fast path: NFC leaves text alone unless some character decomposes, has a
  // non-zero combining class, or can combine with what precedes it.
  bool affected = false;
  for (size_t i = 0; i < s.size() && !affected;) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const uint32_t cp = NextCodePoint(s, &i);
    affected = cp == kReplacement || FindDecomposition(cp) != nullptr ||
               (cp >= kSBase && cp < kSBase + kSCount) || CombiningClassOf(cp) != 0 ||
               IsComposableSecond(cp);
  }
  if (!affected) return std::string(s);

  // 1. Full canonical decomposition.
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) DecomposeInto(NextCodePoint(s, &i), &cps);
  // 2. Canonical ordering: stable sort each run of non-starters by class.
  std::vector<uint32_t> ccc(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) ccc[i] = CombiningClassOf(cps[i]);
  for (size_t i = 0; i < cps.size();) {
    if (ccc[i] == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && ccc[j] != 0) ++j;
    if (j - i > 1) {
      std::vector<std::pair<uint32_t, uint32_t>> run;
      for (size_t k = i; k < j; ++k) run.emplace_back(ccc[k], cps[k]);
      std::stable_sort(run.begin(), run.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      for (size_t k = i; k < j; ++k) {
        ccc[k] = run[k - i].first;
        cps[k] = run[k - i].second;
      }
    }
    i = j;
  }
  // 3. Canonical composition: each character combines with the last starter
  // unless a character in between blocks it (same or higher class, or a
  // starter).
  std::vector<uint32_t> out;
  std::vector<uint32_t> out_ccc;
  out.reserve(cps.size());
  long starter = -1;  // index into `out` of the last starter
  for (size_t i = 0; i < cps.size(); ++i) {
    const uint32_t cp = cps[i], c = ccc[i];
    if (starter >= 0) {
      const uint32_t last_ccc = out.size() - 1 == static_cast<size_t>(starter) ? 0 : out_ccc.back();
      const bool blocked =
          out.size() - 1 != static_cast<size_t>(starter) && (last_ccc == 0 || last_ccc >= c);
      if (!blocked) {
        const uint32_t composite = Compose(out[starter], cp);
        if (composite != 0) {
          out[starter] = composite;
          continue;
        }
      }
    }
    if (c == 0) starter = static_cast<long>(out.size());
    out.push_back(cp);
    out_ccc.push_back(c);
  }
  std::string result;
  result.reserve(s.size());
  for (uint32_t cp : out) AppendUtf8(cp, &result);
  return result;
}

}  // namespace infoflow::unicode
