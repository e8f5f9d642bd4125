#include "engine/text/bpe_trainer.h"

#include <algorithm>
#include <cstdint>
#include <queue>
#include <string_view>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/text/tokenizer_regex.h"
#include "engine/text/unicode.h"
#include "nlohmann/json.hpp"

namespace infoflow {
namespace {

using PairKey = uint64_t;

PairKey Key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
int32_t Left(PairKey k) { return static_cast<int32_t>(k >> 32); }
int32_t Right(PairKey k) { return static_cast<int32_t>(k & 0xFFFFFFFFu); }

// Spelling of byte `b` in GPT-2's byte-level alphabet (same map the
// tokenizer inverts when decoding).
std::string ByteSymbol(int b) {
  uint32_t next = 256;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174);
    const uint32_t cp = printable ? x : next++;
    if (x == b) {
      std::string s;
      unicode::AppendUtf8(cp, &s);
      return s;
    }
  }
  return "";
}

// Heap entry: most frequent first, then smallest (left, right) ids.
struct Entry {
  int64_t count;
  PairKey pair;
  bool operator<(const Entry& o) const {
    if (count != o.count) return count < o.count;
    return pair > o.pair;  // smaller key = smaller (left, right) wins
  }
};

}  // namespace

// Above the count of any prose pair in a few hundred documents, so digit
// groups are never cut by the vocab budget before prose merges are.
constexpr int64_t kDigitGroupCount = 2000;

std::string DigitSplitPattern(int max_digits) {
  const std::string digits =
      max_digits <= 1 ? R"(\p{N})" : absl::StrCat(R"(\p{N}{1,)", max_digits, "}");
  return absl::StrCat(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|)", digits,
                      R"(| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
}

absl::StatusOr<std::string> TrainByteLevelBpeTokenizerJson(
    const std::vector<std::string>& corpus, int vocab_size,
    const std::vector<std::string>& special_tokens, int max_digits) {
  const int num_special = static_cast<int>(special_tokens.size());
  absl::flat_hash_set<std::string> special_set;
  for (const std::string& s : special_tokens) {
    if (s.empty() || !special_set.insert(s).second) {
      return absl::InvalidArgumentError("special tokens must be non-empty and distinct");
    }
  }
  if (vocab_size < num_special + 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab_size ", vocab_size, " < ", num_special, " special tokens + 256 byte symbols"));
  }
  if (max_digits < 0 || max_digits > 3) {
    return absl::InvalidArgumentError(absl::StrCat("max_digits ", max_digits, " not in 0..3"));
  }
  absl::StatusOr<std::unique_ptr<RegexSplitter>> splitter =
      RegexSplitter::Create(max_digits > 0 ? DigitSplitPattern(max_digits) : kGpt2SplitPattern);
  if (!splitter.ok()) return splitter.status();

  // 1. Count pre-tokenized words, with special tokens cut out of the text.
  absl::flat_hash_map<std::string, int64_t> word_counts;
  auto count_words = [&](std::string_view text) {
    for (std::string_view w : (*splitter)->Split(text)) ++word_counts[std::string(w)];
  };
  for (const std::string& raw : corpus) {
    const std::string text = unicode::RepairUtf8(raw);
    size_t start = 0;
    while (start < text.size()) {
      size_t best = std::string::npos, best_len = 0;
      for (const std::string& s : special_tokens) {
        const size_t hit = text.find(s, start);
        if (hit != std::string::npos && (hit < best || (hit == best && s.size() > best_len))) {
          best = hit;
          best_len = s.size();
        }
      }
      if (best == std::string::npos) {
        count_words(std::string_view(text).substr(start));
        break;
      }
      count_words(std::string_view(text).substr(start, best - start));
      start = best + best_len;
    }
  }
  // Every group of 2..max_digits digits gets a token, whatever numbers the
  // corpus happened to hold: each is counted kDigitGroupCount more times.
  // Digit pre-tokens hold digits only, so prose merges keep their order.
  for (int len = 2; len <= max_digits; ++len) {
    int end = 1;
    for (int i = 0; i < len; ++i) end *= 10;
    for (int v = 0; v < end; ++v) {
      std::string group = std::to_string(v);
      group.insert(0, len - group.size(), '0');
      word_counts[group] += kDigitGroupCount;
    }
  }
  // Hash order is not stable across processes: sort for determinism.
  std::vector<std::pair<std::string, int64_t>> sorted(word_counts.begin(), word_counts.end());
  std::sort(sorted.begin(), sorted.end());

  // 2. Initial vocabulary and words as symbol ids.
  std::vector<std::string> tokens(special_tokens.begin(), special_tokens.end());
  for (int b = 0; b < 256; ++b) tokens.push_back(ByteSymbol(b));
  absl::flat_hash_map<std::string, int32_t> token_ids;
  for (size_t i = 0; i < tokens.size(); ++i) token_ids.emplace(tokens[i], i);
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> counts;
  words.reserve(sorted.size());
  for (const auto& [w, c] : sorted) {
    std::vector<int32_t> syms;
    for (char ch : w) syms.push_back(num_special + static_cast<unsigned char>(ch));
    words.push_back(std::move(syms));
    counts.push_back(c);
  }

  // 3. Pair statistics and where each pair occurs.
  absl::flat_hash_map<PairKey, int64_t> pair_counts;
  absl::flat_hash_map<PairKey, std::vector<int32_t>> where;
  for (size_t w = 0; w < words.size(); ++w) {
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      const PairKey k = Key(words[w][i], words[w][i + 1]);
      pair_counts[k] += counts[w];
      std::vector<int32_t>& list = where[k];
      if (list.empty() || list.back() != static_cast<int32_t>(w)) list.push_back(w);
    }
  }
  std::priority_queue<Entry> heap;
  {
    std::vector<Entry> initial;
    for (const auto& [k, c] : pair_counts) initial.push_back({c, k});
    std::sort(initial.begin(), initial.end());  // deterministic heap build
    for (const Entry& e : initial) heap.push(e);
  }

  // 4. Merge loop.
  std::vector<std::pair<int32_t, int32_t>> merges;
  std::vector<int32_t> seen_stamp(words.size(), -1);
  int32_t stamp = 0;
  while (static_cast<int>(tokens.size()) < vocab_size && !heap.empty()) {
    const Entry top = heap.top();
    heap.pop();
    auto pc = pair_counts.find(top.pair);
    if (pc == pair_counts.end() || pc->second != top.count || top.count <= 0) continue;
    const int32_t a = Left(top.pair), b = Right(top.pair);
    const std::string merged_text = tokens[a] + tokens[b];
    if (special_set.contains(merged_text)) {
      pair_counts.erase(pc);  // never spell a special token as a merge
      continue;
    }
    int32_t merged;
    auto existing = token_ids.find(merged_text);
    if (existing != token_ids.end()) {
      merged = existing->second;
    } else {
      merged = static_cast<int32_t>(tokens.size());
      tokens.push_back(merged_text);
      token_ids.emplace(merged_text, merged);
    }
    merges.emplace_back(a, b);

    std::vector<PairKey> touched;
    std::vector<int32_t> occurrences = std::move(where[top.pair]);
    where.erase(top.pair);
    ++stamp;
    for (int32_t w : occurrences) {
      if (seen_stamp[w] == stamp) continue;
      seen_stamp[w] = stamp;
      std::vector<int32_t>& syms = words[w];
      const int64_t c = counts[w];
      bool has = false;
      for (size_t i = 0; i + 1 < syms.size() && !has; ++i) has = syms[i] == a && syms[i + 1] == b;
      if (!has) continue;
      for (size_t i = 0; i + 1 < syms.size(); ++i) {
        const PairKey k = Key(syms[i], syms[i + 1]);
        pair_counts[k] -= c;
        touched.push_back(k);
      }
      std::vector<int32_t> out;
      out.reserve(syms.size());
      for (size_t i = 0; i < syms.size();) {
        if (i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b) {
          out.push_back(merged);
          i += 2;
        } else {
          out.push_back(syms[i++]);
        }
      }
      syms = std::move(out);
      for (size_t i = 0; i + 1 < syms.size(); ++i) {
        const PairKey k = Key(syms[i], syms[i + 1]);
        pair_counts[k] += c;
        touched.push_back(k);
        std::vector<int32_t>& list = where[k];
        if (list.empty() || list.back() != w) list.push_back(w);
      }
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (PairKey k : touched) {
      auto it = pair_counts.find(k);
      if (it == pair_counts.end()) continue;
      if (it->second <= 0) {
        pair_counts.erase(it);
      } else if (k != top.pair) {
        heap.push({it->second, k});
      }
    }
    pair_counts.erase(top.pair);
  }

  // 5. tokenizer.json.
  using ojson = nlohmann::ordered_json;
  ojson root;
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  ojson added = ojson::array();
  for (int i = 0; i < num_special; ++i) {
    added.push_back({{"id", i},
                     {"content", special_tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  root["added_tokens"] = added;
  root["normalizer"] = nullptr;
  if (max_digits > 0) {
    root["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", DigitSplitPattern(max_digits)}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", false},
           {"use_regex", false}}}}};
  } else {
    root["pre_tokenizer"] = {{"type", "ByteLevel"},
                             {"add_prefix_space", false},
                             {"trim_offsets", true},
                             {"use_regex", true}};
  }
  std::string bos;
  for (const char* candidate : {"<s>", "<|begin_of_text|>"}) {
    if (special_set.contains(candidate)) {
      bos = candidate;
      break;
    }
  }
  if (!bos.empty()) {
    root["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair",
         {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
          {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
          {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens",
         {{bos, {{"id", bos}, {"ids", {token_ids.at(bos)}}, {"tokens", {bos}}}}}}};
  } else {
    root["post_processor"] = {{"type", "ByteLevel"},
                              {"add_prefix_space", false},
                              {"trim_offsets", false},
                              {"use_regex", false}};
  }
  root["decoder"] = {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", false},
                     {"use_regex", false}};
  ojson vocab = ojson::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  ojson merge_list = ojson::array();
  for (const auto& [a, b] : merges) merge_list.push_back({tokens[a], tokens[b]});
  root["model"] = {{"type", "BPE"},
                   {"dropout", nullptr},
                   {"unk_token", nullptr},
                   {"continuing_subword_prefix", nullptr},
                   {"end_of_word_suffix", nullptr},
                   {"fuse_unk", false},
                   {"byte_fallback", false},
                   {"ignore_merges", false},
                   {"vocab", vocab},
                   {"merges", merge_list}};
  return root.dump(2);
}

}  // namespace infoflow
