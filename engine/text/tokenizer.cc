#include "engine/text/tokenizer.h"

#include <re2/re2.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <fstream>
#include <queue>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/text/tokenizer_regex.h"
#include "engine/text/unicode.h"
#include "nlohmann/json.hpp"

namespace infoflow {
namespace {

// A token id or a count from JSON: -1 (rejected by the callers' checks)
// unless it is an integer in [0, INT32_MAX]. get<int64_t>() on 1e113, or
// value(key, 0) on 2e97, is a float-to-integer conversion out of range,
// undefined behaviour (both found by tokenizer_fuzz): every integer the
// loader reads goes through here.
int64_t JsonNonNegativeInt32(const nlohmann::json& j) {
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    return u <= INT32_MAX ? static_cast<int64_t>(u) : -1;
  }
  if (!j.is_number_integer()) return -1;
  const int64_t v = j.get<int64_t>();
  return v >= 0 && v <= INT32_MAX ? v : -1;
}

using json = nlohmann::json;

// GPT-2's reversible byte -> printable character map: printable Latin-1
// bytes map to themselves, the other 68 bytes to U+0100.. in byte order, so
// every byte string becomes a string without spaces or control characters.
std::array<uint32_t, 256> ByteToUnicode() {
  std::array<uint32_t, 256> map{};
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    map[b] = printable ? b : next++;
  }
  return map;
}

// Cache only short words: long ones (SentencePiece-style models see whole
// segments as one word) would fill memory and rarely repeat.
constexpr size_t kMaxCachedWordBytes = 128;
constexpr size_t kMaxCacheEntries = 1 << 18;

// Debian's abseil has its own string_view type; heterogeneous lookups in
// flat_hash_map<std::string, ...> need it rather than std::string_view.
absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = unicode::ValidSequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

void ReplaceAll(std::string* s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s->find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(*s, pos, hit - pos);
    out.append(to);
  }
  out.append(*s, pos, std::string::npos);
  *s = std::move(out);
}

// Returns the byte value of a "<0xNN>" token, or -1.
int ByteFallbackValue(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = token[k];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return -1;
    v = v * 16 + d;
  }
  return v;
}

std::string GetString(const json& j, const char* key, const std::string& dflt = "") {
  auto it = j.find(key);
  return (it != j.end() && it->is_string()) ? it->get<std::string>() : dflt;
}
bool GetBool(const json& j, const char* key, bool dflt) {
  auto it = j.find(key);
  return (it != j.end() && it->is_boolean()) ? it->get<bool>() : dflt;
}

}  // namespace

struct Tokenizer::Impl {
  struct NormStep {
    enum Kind { kNfc, kPrepend, kReplace, kReplaceRegex } kind;
    std::string a, b;  // Prepend: a; Replace: a -> b
    std::unique_ptr<RE2> re;
  };
  struct PreStep {
    enum Kind { kSplitRegex, kSplitString, kByteLevel, kMetaspace, kDigits } kind;
    std::unique_ptr<RegexSplitter> splitter;  // kSplitRegex, kByteLevel+use_regex
    std::string literal;                      // kSplitString; kMetaspace replacement
    bool removed = false;                     // Split behavior "Removed"
    bool add_prefix_space = false;            // ByteLevel
    int prepend_scheme = 0;                   // Metaspace: 0 never, 1 first, 2 always
    bool split = false;                       // Metaspace
    bool individual_digits = false;           // Digits
  };
  struct Merge {
    uint32_t rank;
    int32_t merged;
  };
  struct Added {
    std::string content;
    int32_t id;
  };

  std::vector<NormStep> normalizers;
  std::vector<PreStep> pre_tokenizers;
  bool byte_level = false;  // words are mapped through ByteToUnicode
  std::array<int32_t, 256> byte_ids{};            // byte-level: id of each byte symbol
  std::array<int32_t, 256> fallback_ids{};        // byte_fallback: id of <0xNN>
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  int32_t unk_id = -1;
  absl::flat_hash_map<uint64_t, Merge> merges;
  std::array<std::vector<Added>, 256> added_by_first_byte;  // longest first

  static uint64_t Key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
};

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open tokenizer file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = FromJsonString(ss.str());
  if (!t.ok()) {
    return absl::Status(t.status().code(), absl::StrCat(path, ": ", t.status().message()));
  }
  return t;
}

// Parsing is written as one function with early returns; nlohmann throws on
// type mismatches, which we turn into InvalidArgument at the end.
absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJsonString(std::string_view text) {
  json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError("tokenizer.json is not a valid JSON object");
  }
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  Impl& impl = *tok->impl_;
  try {
    // ---- model ----
    const json& model = root.at("model");
    const std::string type = GetString(model, "type", "BPE");
    if (type != "BPE") {
      return absl::UnimplementedError(absl::StrCat("model type ", type, " is not supported"));
    }
    if (model.contains("dropout") && !model["dropout"].is_null() &&
        model["dropout"].get<double>() != 0.0) {
      return absl::UnimplementedError("BPE dropout is not supported");
    }
    if (!GetString(model, "continuing_subword_prefix").empty() ||
        !GetString(model, "end_of_word_suffix").empty()) {
      return absl::UnimplementedError(
          "continuing_subword_prefix / end_of_word_suffix are not supported");
    }
    const json& vocab = model.at("vocab");
    if (!vocab.is_object()) return absl::InvalidArgumentError("model.vocab must be an object");
    int64_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      max_id = std::max<int64_t>(max_id, JsonNonNegativeInt32(it.value()));
    }
    const json empty_array = json::array();
    const json& added = root.contains("added_tokens") && root["added_tokens"].is_array()
                            ? root["added_tokens"]
                            : empty_array;
    for (const json& a : added) {
      max_id = std::max<int64_t>(max_id, JsonNonNegativeInt32(a.at("id")));
    }
    // Ids are dense in real files; a bound tied to the entry count keeps a
    // tiny hostile file from allocating gigabytes (found by tokenizer_fuzz).
    const int64_t entries = static_cast<int64_t>(vocab.size() + added.size());
    if (max_id < 0 || max_id >= 4 * entries + 1024) {
      return absl::InvalidArgumentError(absl::StrCat(
          "vocab is empty or has out-of-range ids (max id ", max_id, " for ", entries, " entries)"));
    }
    tok->id_to_token_.resize(max_id + 1);
    tok->special_.assign(max_id + 1, false);
    std::vector<bool> is_added(max_id + 1, false);
    tok->token_to_id_.reserve(vocab.size() + added.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int64_t id = JsonNonNegativeInt32(it.value());
      if (id < 0) return absl::InvalidArgumentError("negative id in vocab");
      tok->id_to_token_[id] = it.key();
      tok->token_to_id_[it.key()] = static_cast<int32_t>(id);
    }
    for (const json& a : added) {
      const int64_t id = JsonNonNegativeInt32(a.at("id"));
      const std::string content = a.at("content").get<std::string>();
      if (id < 0 || content.empty()) return absl::InvalidArgumentError("bad added token");
      tok->id_to_token_[id] = content;
      tok->token_to_id_[content] = static_cast<int32_t>(id);
      tok->special_[id] = GetBool(a, "special", false);
      is_added[id] = true;
      impl.added_by_first_byte[static_cast<unsigned char>(content[0])].push_back(
          {content, static_cast<int32_t>(id)});
    }
    for (auto& list : impl.added_by_first_byte) {
      std::stable_sort(list.begin(), list.end(), [](const auto& a, const auto& b) {
        return a.content.size() > b.content.size();
      });
    }

    impl.byte_fallback = GetBool(model, "byte_fallback", false);
    impl.fuse_unk = GetBool(model, "fuse_unk", false);
    impl.ignore_merges = GetBool(model, "ignore_merges", false);
    const std::string unk = GetString(model, "unk_token");
    if (!unk.empty()) {
      auto it = tok->token_to_id_.find(unk);
      if (it == tok->token_to_id_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("unk_token ", unk, " is not in vocab"));
      }
      impl.unk_id = it->second;
    }
    impl.fallback_ids.fill(-1);
    if (impl.byte_fallback) {
      for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        auto it = tok->token_to_id_.find(name);
        if (it != tok->token_to_id_.end()) impl.fallback_ids[b] = it->second;
      }
    }

    // Merges: rank = position; a merge whose parts or result are not in the
    // vocab can never fire, so it is dropped.
    if (model.contains("merges") && model["merges"].is_array()) {
      const json& merges = model["merges"];
      impl.merges.reserve(merges.size());
      uint32_t rank = 0;
      auto lookup = [&](std::string_view s) -> int32_t {
        auto it = tok->token_to_id_.find(AV(s));
        return it == tok->token_to_id_.end() ? -1 : it->second;
      };
      for (const json& m : merges) {
        int32_t a = -1, b = -1, merged = -1;
        if (m.is_array() && m.size() == 2) {
          const std::string sa = m[0].get<std::string>(), sb = m[1].get<std::string>();
          a = lookup(sa);
          b = lookup(sb);
          merged = lookup(sa + sb);
        } else if (m.is_string()) {
          const std::string s = m.get<std::string>();
          // Usually exactly one space; if there are several, take the first
          // split whose halves are both tokens.
          for (size_t sp = s.find(' '); sp != std::string::npos; sp = s.find(' ', sp + 1)) {
            a = lookup(std::string_view(s).substr(0, sp));
            b = lookup(std::string_view(s).substr(sp + 1));
            if (a >= 0 && b >= 0) {
              merged = lookup(s.substr(0, sp) + s.substr(sp + 1));
              break;
            }
          }
        } else {
          return absl::InvalidArgumentError("merges entries must be strings or pairs");
        }
        if (a >= 0 && b >= 0 && merged >= 0) {
          impl.merges.try_emplace(Impl::Key(a, b), Impl::Merge{rank, merged});
        }
        ++rank;
      }
    }

    // ---- normalizer ----
    std::function<absl::Status(const json&)> add_norm = [&](const json& n) -> absl::Status {
      if (n.is_null()) return absl::OkStatus();
      const std::string t = GetString(n, "type");
      if (t == "Sequence") {
        for (const json& c : n.at("normalizers")) {
          absl::Status s = add_norm(c);
          if (!s.ok()) return s;
        }
      } else if (t == "NFC") {
        impl.normalizers.push_back({Impl::NormStep::kNfc, "", "", nullptr});
      } else if (t == "Prepend") {
        impl.normalizers.push_back({Impl::NormStep::kPrepend, n.at("prepend").get<std::string>(),
                                    "", nullptr});
      } else if (t == "Replace") {
        const json& p = n.at("pattern");
        const std::string content = n.at("content").get<std::string>();
        if (p.contains("String")) {
          impl.normalizers.push_back(
              {Impl::NormStep::kReplace, p["String"].get<std::string>(), content, nullptr});
        } else if (p.contains("Regex")) {
          bool la;
          absl::StatusOr<std::string> re =
              RegexSplitter::Translate(p["Regex"].get<std::string>(), &la);
          if (!re.ok()) return re.status();
          if (la) return absl::UnimplementedError("lookahead in a Replace normalizer");
          auto compiled = std::make_unique<RE2>(*re);
          if (!compiled->ok()) return absl::InvalidArgumentError(compiled->error());
          impl.normalizers.push_back(
              {Impl::NormStep::kReplaceRegex, "", content, std::move(compiled)});
        } else {
          return absl::InvalidArgumentError("Replace normalizer without pattern");
        }
      } else {
        return absl::UnimplementedError(absl::StrCat("normalizer ", t, " is not supported"));
      }
      return absl::OkStatus();
    };
    if (root.contains("normalizer")) {
      absl::Status s = add_norm(root["normalizer"]);
      if (!s.ok()) return s;
    }

    // ---- pre_tokenizer ----
    std::function<absl::Status(const json&)> add_pre = [&](const json& p) -> absl::Status {
      if (p.is_null()) return absl::OkStatus();
      const std::string t = GetString(p, "type");
      Impl::PreStep step{};
      if (t == "Sequence") {
        for (const json& c : p.at("pretokenizers")) {
          absl::Status s = add_pre(c);
          if (!s.ok()) return s;
        }
        return absl::OkStatus();
      } else if (t == "Split") {
        if (GetBool(p, "invert", false)) {
          return absl::UnimplementedError("Split pre-tokenizer with invert=true");
        }
        const std::string behavior = GetString(p, "behavior", "Isolated");
        if (behavior != "Isolated" && behavior != "Removed") {
          return absl::UnimplementedError(
              absl::StrCat("Split behavior ", behavior, " is not supported"));
        }
        step.removed = behavior == "Removed";
        const json& pat = p.at("pattern");
        if (pat.contains("Regex")) {
          step.kind = Impl::PreStep::kSplitRegex;
          auto sp = RegexSplitter::Create(pat["Regex"].get<std::string>());
          if (!sp.ok()) return sp.status();
          step.splitter = *std::move(sp);
        } else {
          step.kind = Impl::PreStep::kSplitString;
          step.literal = pat.at("String").get<std::string>();
          if (step.literal.empty()) return absl::InvalidArgumentError("empty Split pattern");
        }
      } else if (t == "ByteLevel") {
        step.kind = Impl::PreStep::kByteLevel;
        step.add_prefix_space = GetBool(p, "add_prefix_space", false);
        if (GetBool(p, "use_regex", true)) {
          auto sp = RegexSplitter::Create(kGpt2SplitPattern);
          if (!sp.ok()) return sp.status();
          step.splitter = *std::move(sp);
        }
        impl.byte_level = true;
      } else if (t == "Metaspace") {
        step.kind = Impl::PreStep::kMetaspace;
        step.literal = GetString(p, "replacement", "\xE2\x96\x81");
        const std::string scheme = GetString(p, "prepend_scheme", "");
        if (!scheme.empty()) {
          step.prepend_scheme = scheme == "always" ? 2 : scheme == "first" ? 1 : 0;
        } else {
          step.prepend_scheme = GetBool(p, "add_prefix_space", true) ? 2 : 0;
        }
        step.split = GetBool(p, "split", true);
      } else if (t == "Digits") {
        step.kind = Impl::PreStep::kDigits;
        step.individual_digits = GetBool(p, "individual_digits", false);
      } else {
        return absl::UnimplementedError(absl::StrCat("pre_tokenizer ", t, " is not supported"));
      }
      impl.pre_tokenizers.push_back(std::move(step));
      return absl::OkStatus();
    };
    if (root.contains("pre_tokenizer")) {
      absl::Status s = add_pre(root["pre_tokenizer"]);
      if (!s.ok()) return s;
    }
    if (impl.byte_level) {
      const std::array<uint32_t, 256> b2u = ByteToUnicode();
      for (int b = 0; b < 256; ++b) {
        std::string sym;
        unicode::AppendUtf8(b2u[b], &sym);
        auto it = tok->token_to_id_.find(sym);
        impl.byte_ids[b] = it == tok->token_to_id_.end() ? impl.unk_id : it->second;
      }
    }

    // ---- decoder ----
    bool dec_byte_level = false, dec_byte_fallback = false;
    std::vector<std::pair<std::string, std::string>> dec_replace;
    std::function<absl::Status(const json&)> add_dec = [&](const json& d) -> absl::Status {
      if (d.is_null()) return absl::OkStatus();
      const std::string t = GetString(d, "type");
      if (t == "Sequence") {
        for (const json& c : d.at("decoders")) {
          absl::Status s = add_dec(c);
          if (!s.ok()) return s;
        }
      } else if (t == "ByteLevel") {
        dec_byte_level = true;
      } else if (t == "ByteFallback") {
        dec_byte_fallback = true;
      } else if (t == "Fuse") {
        // Concatenation is what we do anyway.
      } else if (t == "Replace") {
        const json& p = d.at("pattern");
        if (!p.contains("String")) {
          return absl::UnimplementedError("Replace decoder with a Regex pattern");
        }
        dec_replace.emplace_back(p["String"].get<std::string>(),
                                 d.at("content").get<std::string>());
      } else if (t == "Strip") {
        const int64_t start = d.contains("start") ? JsonNonNegativeInt32(d["start"]) : 0;
        const int64_t stop = d.contains("stop") ? JsonNonNegativeInt32(d["stop"]) : 0;
        if (start < 0 || stop < 0) {
          return absl::InvalidArgumentError(
              "Strip decoder: start and stop must be non-negative integers");
        }
        if (GetString(d, "content") != " " || stop != 0) {
          return absl::UnimplementedError("Strip decoder other than leading spaces");
        }
        tok->strip_leading_ = static_cast<int>(start);
      } else if (t == "Metaspace") {
        dec_replace.emplace_back(GetString(d, "replacement", "\xE2\x96\x81"), " ");
        const std::string scheme = GetString(d, "prepend_scheme", "");
        const bool prefix = scheme.empty() ? GetBool(d, "add_prefix_space", true)
                                           : scheme != "never";
        if (prefix) tok->strip_leading_ = 1;
      } else {
        return absl::UnimplementedError(absl::StrCat("decoder ", t, " is not supported"));
      }
      return absl::OkStatus();
    };
    if (root.contains("decoder")) {
      absl::Status s = add_dec(root["decoder"]);
      if (!s.ok()) return s;
    }
    std::array<int, 0x180> u2b;  // ByteToUnicode's inverse (all targets < 0x180)
    u2b.fill(-1);
    {
      const std::array<uint32_t, 256> b2u = ByteToUnicode();
      for (int b = 0; b < 256; ++b) u2b[b2u[b]] = b;
    }
    tok->id_bytes_.resize(tok->id_to_token_.size());
    for (size_t id = 0; id < tok->id_to_token_.size(); ++id) {
      const std::string& t = tok->id_to_token_[id];
      std::string& out = tok->id_bytes_[id];
      if (is_added[id]) {
        out = t;  // added tokens are not byte-mapped: they are plain text
        continue;
      }
      if (dec_byte_fallback) {
        const int b = ByteFallbackValue(t);
        if (b >= 0) {
          out.assign(1, static_cast<char>(b));
          continue;
        }
      }
      if (dec_byte_level) {
        for (size_t i = 0; i < t.size();) {
          const size_t start = i;
          const uint32_t cp = unicode::NextCodePoint(t, &i);
          if (cp < u2b.size() && u2b[cp] >= 0) {
            out.push_back(static_cast<char>(u2b[cp]));
          } else {
            out.append(t, start, i - start);
          }
        }
      } else {
        out = t;
      }
      for (const auto& [from, to] : dec_replace) ReplaceAll(&out, from, to);
    }

    // ---- post_processor ----
    std::function<absl::Status(const json&)> add_post = [&](const json& p) -> absl::Status {
      if (p.is_null()) return absl::OkStatus();
      const std::string t = GetString(p, "type");
      if (t == "Sequence") {
        for (const json& c : p.at("processors")) {
          absl::Status s = add_post(c);
          if (!s.ok()) return s;
        }
      } else if (t == "TemplateProcessing") {
        bool seen_a = false;
        for (const json& item : p.at("single")) {
          if (item.contains("Sequence")) {
            seen_a = true;
            continue;
          }
          if (!item.contains("SpecialToken")) continue;
          const std::string name = item["SpecialToken"].at("id").get<std::string>();
          std::vector<int32_t> ids;
          if (p.contains("special_tokens") && p["special_tokens"].contains(name)) {
            for (const json& i : p["special_tokens"][name].at("ids")) {
              ids.push_back(static_cast<int32_t>(JsonNonNegativeInt32(i)));
            }
          } else {
            auto it = tok->token_to_id_.find(name);
            if (it == tok->token_to_id_.end()) {
              return absl::InvalidArgumentError(
                  absl::StrCat("template token ", name, " is not in vocab"));
            }
            ids.push_back(it->second);
          }
          for (int32_t id : ids) {
            if (id < 0 || id >= static_cast<int32_t>(tok->id_to_token_.size())) {
              return absl::InvalidArgumentError(
                  absl::StrCat("post_processor token ", name, " has out-of-range id ", id));
            }
          }
          auto& dst = seen_a ? tok->suffix_ids_ : tok->prefix_ids_;
          dst.insert(dst.end(), ids.begin(), ids.end());
        }
      }
      // ByteLevel / RobertaProcessing / BertProcessing and others: offsets
      // or pair handling only as far as single-sequence ids are concerned
      // (Roberta/Bert would add cls/sep; none of our models use them).
      return absl::OkStatus();
    };
    if (root.contains("post_processor")) {
      absl::Status s = add_post(root["post_processor"]);
      if (!s.ok()) return s;
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("malformed tokenizer.json: ", e.what()));
  }
  return tok;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> out;
  if (add_special) out = prefix_ids_;
  EncodePiecesInto({Piece{text, true}}, &out);
  if (add_special) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

std::vector<int32_t> Tokenizer::EncodePieces(const std::vector<Piece>& pieces) const {
  std::vector<int32_t> out;
  EncodePiecesInto(pieces, &out);
  return out;
}

void Tokenizer::EncodePiecesInto(const std::vector<Piece>& pieces,
                                 std::vector<int32_t>* out) const {
  // The plain text since the last added token, as views into the pieces; it
  // is encoded as one segment when the next added token (or the end) comes,
  // so a run that crosses a piece boundary tokenizes as the joined text would.
  std::vector<std::string_view> run;
  std::string joined;
  auto flush = [&] {
    if (run.size() == 1) {
      EncodeSegment(run[0], out);
    } else if (run.size() > 1) {
      joined.clear();
      for (std::string_view part : run) joined.append(part);
      EncodeSegment(joined, out);
    }
    run.clear();
  };
  std::vector<std::string> repaired;  // keeps repaired piece texts alive for `run`
  repaired.reserve(pieces.size());
  size_t bytes = 0;
  for (const Piece& p : pieces) bytes += p.text.size();
  out->reserve(out->size() + bytes / 3 + 4);
  for (const Piece& piece : pieces) {
    std::string_view text = piece.text;
    if (!IsValidUtf8(text)) {
      repaired.push_back(unicode::RepairUtf8(text));
      text = repaired.back();
    }
    // Split around added tokens, leftmost then longest; special ones only
    // where the piece allows them.
    size_t seg_start = 0;
    for (size_t i = 0; i < text.size();) {
      const auto& cands = impl_->added_by_first_byte[static_cast<unsigned char>(text[i])];
      const Impl::Added* hit = nullptr;
      for (const Impl::Added& a : cands) {
        if ((piece.parse_special || !special_[a.id]) &&
            text.compare(i, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
      }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      if (i > seg_start) run.push_back(text.substr(seg_start, i - seg_start));
      flush();
      out->push_back(hit->id);
      i += hit->content.size();
      seg_start = i;
    }
    if (seg_start < text.size()) run.push_back(text.substr(seg_start));
  }
  flush();
}

void Tokenizer::EncodeSegment(std::string_view segment, std::vector<int32_t>* out) const {
  // Normalize.
  std::string norm(segment);
  for (const Impl::NormStep& n : impl_->normalizers) {
    switch (n.kind) {
      case Impl::NormStep::kNfc:
        norm = unicode::NormalizeNfc(norm);
        break;
      case Impl::NormStep::kPrepend:
        if (!norm.empty()) norm.insert(0, n.a);
        break;
      case Impl::NormStep::kReplace:
        ReplaceAll(&norm, n.a, n.b);
        break;
      case Impl::NormStep::kReplaceRegex: {
        // Replace literally (no \1 expansion): escape RE2's rewrite syntax.
        std::string rewrite;
        for (char c : n.b) {
          if (c == '\\') rewrite.push_back('\\');
          rewrite.push_back(c);
        }
        RE2::GlobalReplace(&norm, *n.re, rewrite);
        break;
      }
    }
  }
  if (norm.empty()) return;
  // Pre-tokenize: each step maps the list of pieces to a new list.
  std::vector<std::string> pieces{std::move(norm)};
  bool first_piece_of_input = true;
  for (const Impl::PreStep& p : impl_->pre_tokenizers) {
    std::vector<std::string> next;
    next.reserve(pieces.size());
    for (std::string& piece : pieces) {
      switch (p.kind) {
        case Impl::PreStep::kSplitRegex:
          for (std::string_view s : p.splitter->Split(piece, p.removed)) next.emplace_back(s);
          break;
        case Impl::PreStep::kSplitString: {
          size_t prev = 0;
          for (size_t hit; (hit = piece.find(p.literal, prev)) != std::string::npos;
               prev = hit + p.literal.size()) {
            if (hit > prev) next.push_back(piece.substr(prev, hit - prev));
            if (!p.removed) next.push_back(p.literal);
          }
          if (prev < piece.size()) next.push_back(piece.substr(prev));
          break;
        }
        case Impl::PreStep::kByteLevel: {
          if (p.add_prefix_space && piece[0] != ' ') piece.insert(0, " ");
          if (p.splitter == nullptr) {
            next.push_back(std::move(piece));
          } else {
            for (std::string_view s : p.splitter->Split(piece)) next.emplace_back(s);
          }
          break;
        }
        case Impl::PreStep::kMetaspace: {
          ReplaceAll(&piece, " ", p.literal);
          if ((p.prepend_scheme == 2 || (p.prepend_scheme == 1 && first_piece_of_input)) &&
              piece.compare(0, p.literal.size(), p.literal) != 0) {
            piece.insert(0, p.literal);
          }
          first_piece_of_input = false;
          if (!p.split) {
            next.push_back(std::move(piece));
            break;
          }
          // Each piece starts at a replacement character (merged with next).
          size_t start = 0;
          for (size_t hit = piece.find(p.literal, 1); hit != std::string::npos;
               hit = piece.find(p.literal, hit + 1)) {
            if (hit > start) next.push_back(piece.substr(start, hit - start));
            start = hit;
          }
          next.push_back(piece.substr(start));
          break;
        }
        case Impl::PreStep::kDigits: {
          size_t start = 0;
          auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
          for (size_t i = 1; i <= piece.size(); ++i) {
            const bool boundary =
                i == piece.size() || is_digit(piece[i]) != is_digit(piece[i - 1]) ||
                (p.individual_digits && is_digit(piece[i]));
            if (boundary) {
              next.push_back(piece.substr(start, i - start));
              start = i;
            }
          }
          break;
        }
      }
    }
    pieces = std::move(next);
  }
  for (const std::string& w : pieces) {
    if (!w.empty()) EncodeWord(w, out);
  }
}

void Tokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  const bool cacheable = impl_->byte_level && word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(AV(word));
    if (it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out->size();
  if (impl_->ignore_merges) {
    // The whole word is a token: take it without merging (Llama-3).
    std::string key;
    if (impl_->byte_level) {
      static const std::array<uint32_t, 256> b2u = ByteToUnicode();
      for (char c : word) unicode::AppendUtf8(b2u[static_cast<unsigned char>(c)], &key);
    } else {
      key.assign(word);
    }
    auto it = token_to_id_.find(key);
    if (it != token_to_id_.end()) out->push_back(it->second);
  }
  if (out->size() == start) BpeWord(word, out);
  if (cacheable) {
    std::vector<int32_t> ids(out->begin() + start, out->end());
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(word), std::move(ids));
  }
}

// Merges adjacent symbols of `word` in rank order (lowest rank first, the
// leftmost pair on ties), as Hugging Face's BPE does. A min-heap of
// candidate pairs with lazy invalidation keeps long words O(n log n).
void Tokenizer::BpeWord(std::string_view word, std::vector<int32_t>* out) const {
  struct Sym {
    int32_t id;
    int prev, next;
  };
  std::vector<Sym> syms;
  syms.reserve(word.size());
  auto push = [&](int32_t id) {
    const int n = static_cast<int>(syms.size());
    syms.push_back({id, n - 1, -1});
    if (n > 0) syms[n - 1].next = n;
  };
  if (impl_->byte_level) {
    for (char c : word) {
      const int32_t id = impl_->byte_ids[static_cast<unsigned char>(c)];
      if (id >= 0) push(id);
    }
  } else {
    bool last_unk = false;
    for (size_t i = 0; i < word.size();) {
      const size_t begin = i;
      unicode::NextCodePoint(word, &i);
      auto it = token_to_id_.find(AV(word.substr(begin, i - begin)));
      if (it != token_to_id_.end()) {
        push(it->second);
        last_unk = false;
        continue;
      }
      bool all_bytes = impl_->byte_fallback;
      for (size_t k = begin; k < i && all_bytes; ++k) {
        all_bytes = impl_->fallback_ids[static_cast<unsigned char>(word[k])] >= 0;
      }
      if (all_bytes) {
        for (size_t k = begin; k < i; ++k) {
          push(impl_->fallback_ids[static_cast<unsigned char>(word[k])]);
        }
        last_unk = false;
      } else if (impl_->unk_id >= 0) {
        if (!(impl_->fuse_unk && last_unk)) push(impl_->unk_id);
        last_unk = true;
      }
    }
  }
  if (syms.empty()) return;

  struct Cand {
    uint32_t rank;
    int pos;
    int32_t left, right, merged;
    bool operator>(const Cand& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto consider = [&](int pos) {
    if (pos < 0) return;
    const int nxt = syms[pos].next;
    if (nxt < 0) return;
    auto it = impl_->merges.find(Impl::Key(syms[pos].id, syms[nxt].id));
    if (it == impl_->merges.end()) return;
    heap.push({it->second.rank, pos, syms[pos].id, syms[nxt].id, it->second.merged});
  };
  for (int i = 0; i + 1 < static_cast<int>(syms.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& left = syms[c.pos];
    if (left.id != c.left || left.next < 0) continue;  // stale
    Sym& right = syms[left.next];
    if (right.id != c.right) continue;  // stale
    left.id = c.merged;
    left.next = right.next;
    if (right.next >= 0) syms[right.next].prev = c.pos;
    right.id = -1;  // dead
    consider(left.prev);
    consider(c.pos);
  }
  for (int i = 0; i >= 0; i = syms[i].next) out->push_back(syms[i].id);
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) bytes += DecodedBytes(id, skip_special);
  size_t strip = 0;
  while (strip < static_cast<size_t>(strip_leading_) && strip < bytes.size() &&
         bytes[strip] == ' ') {
    ++strip;
  }
  return unicode::RepairUtf8(std::string_view(bytes).substr(strip));
}

const std::string& Tokenizer::DecodedBytes(int32_t id, bool skip_special) const {
  static const std::string* const kEmpty = new std::string();
  if (id < 0 || id >= vocab_size()) return *kEmpty;
  if (skip_special && special_[id]) return *kEmpty;
  return id_bytes_[id];
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  auto it = token_to_id_.find(AV(token));
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return id_to_token_[id];
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[id];
}

StreamingDecoder::StreamingDecoder(const Tokenizer* tokenizer, bool skip_special)
    : tokenizer_(tokenizer),
      skip_special_(skip_special),
      strip_left_(tokenizer->strip_leading_spaces()) {}

std::string StreamingDecoder::Push(int32_t id) {
  std::string_view bytes = tokenizer_->DecodedBytes(id, skip_special_);
  // Decode strips leading spaces of the whole output; here that is the
  // leading spaces of the first bytes seen, so strip until a non-space.
  while (strip_left_ > 0 && !bytes.empty()) {
    if (bytes[0] != ' ') {
      strip_left_ = 0;
      break;
    }
    bytes.remove_prefix(1);
    --strip_left_;
  }
  pending_.append(bytes);
  size_t held = 0;
  std::string out = unicode::RepairUtf8(pending_, /*hold_incomplete_tail=*/true, &held);
  pending_.erase(0, pending_.size() - held);
  return out;
}

std::string StreamingDecoder::Flush() {
  std::string out = unicode::RepairUtf8(pending_);
  pending_.clear();
  strip_left_ = tokenizer_->strip_leading_spaces();
  return out;
}

}  // namespace infoflow
