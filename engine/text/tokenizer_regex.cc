#include "engine/text/tokenizer_regex.h"

#include <re2/re2.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/text/unicode.h"

namespace infoflow {

const char kGpt2SplitPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// Unicode White_Space, as the body of an RE2 character class.
constexpr char kWhiteSpaceBody[] =
    R"(\t\n\x0B\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
constexpr char kLookaheadAlt[] = R"(\s+(?!\S))";

bool AllWhiteSpace(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (!unicode::IsWhiteSpace(unicode::NextCodePoint(s, &i))) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> RegexSplitter::Translate(std::string_view pattern,
                                                     bool* lookahead_group) {
  *lookahead_group = false;
  std::string out;
  bool in_class = false;
  int depth = 0;
  bool at_alt_start = true;  // at the start of a top-level alternative
  for (size_t i = 0; i < pattern.size();) {
    if (!in_class && depth == 0 && at_alt_start &&
        pattern.substr(i).rfind(kLookaheadAlt, 0) == 0) {
      const size_t after = i + sizeof(kLookaheadAlt) - 1;
      if (after == pattern.size() || pattern[after] == '|') {
        absl::StrAppend(&out, "([", kWhiteSpaceBody, "]+)");
        *lookahead_group = true;
        i = after;
        at_alt_start = false;
        continue;
      }
    }
    at_alt_start = false;
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      if (e == 's') {
        absl::StrAppend(&out, in_class ? "" : "[", kWhiteSpaceBody, in_class ? "" : "]");
      } else if (e == 'S') {
        if (in_class) {
          return absl::UnimplementedError(
              absl::StrCat("\\S inside a character class is not supported: ", std::string(pattern)));
        }
        absl::StrAppend(&out, "[^", kWhiteSpaceBody, "]");
      } else if (e >= '1' && e <= '9' && !in_class) {
        return absl::UnimplementedError(absl::StrCat("backreference in regex: ", std::string(pattern)));
      } else {
        out.append(pattern.data() + i, 2);
      }
      i += 2;
      continue;
    }
    if (in_class) {
      if (c == ']') in_class = false;
      out.push_back(c);
      ++i;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out.push_back(c);
      ++i;
      // A ']' right after '[' or '[^' is a literal member.
      if (i < pattern.size() && pattern[i] == '^') out.push_back(pattern[i++]);
      if (i < pattern.size() && pattern[i] == ']') out.push_back(pattern[i++]);
      continue;
    }
    if (c == '(') {
      ++depth;
      if (i + 1 < pattern.size() && pattern[i + 1] == '?') {
        if (i + 2 < pattern.size() &&
            (pattern[i + 2] == '=' || pattern[i + 2] == '!' || pattern[i + 2] == '<')) {
          return absl::UnimplementedError(
              absl::StrCat("lookaround is not supported (except \\s+(?!\\S)): ", std::string(pattern)));
        }
        out.push_back(c);
      } else {
        out.append("(?:");  // keep group numbering for the lookahead fix-up
      }
      ++i;
      continue;
    }
    if (c == ')') --depth;
    if (c == '|' && depth == 0) at_alt_start = true;
    out.push_back(c);
    ++i;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<RegexSplitter>> RegexSplitter::Create(std::string_view pattern) {
  std::unique_ptr<RegexSplitter> s(new RegexSplitter());
  absl::StatusOr<std::string> t = Translate(pattern, &s->lookahead_group_);
  if (!t.ok()) return t.status();
  s->translated_ = *std::move(t);
  RE2::Options options;
  options.set_log_errors(false);
  options.set_encoding(RE2::Options::EncodingUTF8);
  s->re_ = std::make_unique<RE2>(s->translated_, options);
  if (!s->re_->ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot compile regex '", std::string(pattern), "' as '", s->translated_, "': ",
                     s->re_->error()));
  }
  return s;
}

RegexSplitter::~RegexSplitter() = default;

std::vector<std::pair<size_t, size_t>> RegexSplitter::FindAll(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  re2::StringPiece input(text.data(), text.size());
  re2::StringPiece groups[2];
  size_t pos = 0;
  while (pos < text.size()) {
    // Finding only the overall match lets RE2 stay on its fast DFA path.
    if (!re_->Match(input, pos, text.size(), RE2::UNANCHORED, groups, 1)) break;
    size_t begin = groups[0].data() - text.data();
    size_t end = begin + groups[0].size();
    if (end == begin) {
      // An empty match: skip one character so we make progress.
      size_t next = begin;
      unicode::NextCodePoint(text, &next);
      pos = next;
      continue;
    }
    if (lookahead_group_ && end < text.size() && AllWhiteSpace(text.substr(begin, end - begin)) &&
        re_->Match(input, begin, text.size(), RE2::ANCHOR_START, groups, 2) &&
        groups[1].data() != nullptr) {
      // `\s+(?!\S)`: the greedy run stopped before a non-space, so the real
      // lookahead match leaves the run's last character to the next match.
      size_t last = begin, i = begin;
      while (i < end) {
        last = i;
        unicode::NextCodePoint(text, &i);
      }
      if (last > begin) end = last;
    }
    out.emplace_back(begin, end);
    pos = end;
  }
  return out;
}

std::vector<std::string_view> RegexSplitter::Split(std::string_view text,
                                                   bool drop_matches) const {
  std::vector<std::string_view> pieces;
  size_t prev = 0;
  for (const auto& [b, e] : FindAll(text)) {
    if (b > prev) pieces.push_back(text.substr(prev, b - prev));
    if (!drop_matches) pieces.push_back(text.substr(b, e - b));
    prev = e;
  }
  if (prev < text.size()) pieces.push_back(text.substr(prev));
  return pieces;
}

}  // namespace infoflow
