#include "server/chunk_resolver.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cache_store/chunk_store.h"
#include "engine/chunk/chunk_codec.h"
#include "engine/chunk/chunk_prefill.h"
#include "engine/text/tokenizer.h"
#include "server/quoted_value.h"
#include "server/token_limit.h"

namespace infoflow::server {

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07;
    else return false;
    if (i + len > n) return false;
    for (int j = 1; j < len; ++j) {
      const unsigned char cc = static_cast<unsigned char>(s[i + j]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += len;
  }
  return true;
}

ChunkResolver::ChunkResolver(const Model* model, const Tokenizer* tokenizer,
                             store::ChunkStore* store, int64_t max_chunk_tokens,
                             const KvCodec& codec)
    : model_(model),
      tokenizer_(tokenizer),
      store_(store),
      max_chunk_tokens_(max_chunk_tokens),
      codec_(codec) {}

std::vector<int32_t> ChunkResolver::Tokenize(std::string_view text) const {
  return tokenizer_->Encode(text);
}

absl::Status ChunkResolver::CheckedText(std::string_view text, const std::string& field) const {
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": empty chunk text"));
  if (!IsValidUtf8(text)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": text is not valid UTF-8"));
  }
  // Bytes bound tokens from above for our tokenizers' ordinary text, so a
  // huge text is refused before the tokenizer spends time on it.
  if (text.size() > static_cast<uint64_t>(max_chunk_tokens_) * kMaxBytesPerToken) {
    return TokenLimitError(
        absl::StatusCode::kInvalidArgument,
        absl::StrCat(field, ": ", text.size(), " bytes, more than ", max_chunk_tokens_,
                     " tokens can hold (--max-chunk-tokens ", max_chunk_tokens_, ", ",
                     kMaxBytesPerToken, " bytes per token)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> ChunkResolver::ChunkTokens(std::string_view text,
                                                                const std::string& field,
                                                                bool parse_special) const {
  if (absl::Status s = CheckedText(text, field); !s.ok()) return s;
  return CheckedTokens(text, field, parse_special);
}

absl::StatusOr<std::vector<int32_t>> ChunkResolver::CheckedTokens(std::string_view text,
                                                                  const std::string& field,
                                                                  bool parse_special) const {
  std::vector<int32_t> ids = tokenizer_->EncodePieces({{text, parse_special}});
  if (ids.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": chunk has no tokens"));
  if (static_cast<int64_t>(ids.size()) > max_chunk_tokens_) {
    return TokenLimitError(absl::StatusCode::kInvalidArgument,
                           absl::StrCat(field, ": chunk has ", ids.size(), " tokens, limit is ",
                                        max_chunk_tokens_, " (--max-chunk-tokens)"));
  }
  return ids;
}

absl::StatusOr<IngestOutcome> ChunkResolver::Ingest(const std::vector<int32_t>& ids,
                                                    PrefixMode mode) const {
  const store::ChunkKey key = ChunkKeyFor(*model_, ids, mode, codec_);
  IngestOutcome out;
  out.key_hex = key.Hex();
  out.n_tokens = static_cast<int64_t>(ids.size());
  absl::StatusOr<store::GetResult> got = store_->Get(key);
  if (!got.ok()) return got.status();
  if (got->status == store::GetStatus::kFound) {
    out.already_present = true;
    // Just fetched from the cluster: it is there.
    out.remote_state = got->from_remote ? store::RemoteWriteState::kWritten
                                        : store_->RemoteState(key);
    return out;
  }
  absl::StatusOr<ChunkKv> kv = PrefillChunk(*model_, ids, mode);
  if (!kv.ok()) return kv.status();
  absl::StatusOr<std::string> record = EncodeChunkRecord(*model_, *kv, mode, codec_);
  if (!record.ok()) return record.status();
  absl::StatusOr<store::PutResult> put = store_->Put(key, *std::move(record));
  if (!put.ok()) return put.status();
  out.already_present = *put == store::PutResult::kAlreadyPresent;
  out.remote_state = store_->RemoteState(key);
  return out;
}

absl::StatusOr<ResolvedPrefix> ChunkResolver::ResolvePrefix(const std::vector<int32_t>& ids,
                                                            PrefixStorePolicy policy) const {
  const KvCodec lossless;  // raw
  const store::ChunkKey key = ChunkKeyFor(*model_, ids, PrefixMode::kNone, lossless);
  ResolvedPrefix out;
  out.key_hex = key.Hex();
  absl::StatusOr<store::GetResult> res = absl::UnknownError("");
  bool found = false;
  if (policy != PrefixStorePolicy::kAlways) {
    // Look first; a miss is stored only under kRepeated, seen before.
    res = store_->Get(key);
    if (!res.ok()) return res.status();
    found = res->status == store::GetStatus::kFound;
    if (!found &&
        !(policy == PrefixStorePolicy::kRepeated && recent_prefixes_.SeenBefore(out.key_hex))) {
      // Prefilled for this query only: no record, no RAM-tier entry.
      absl::StatusOr<ChunkKv> kv = PrefillChunk(*model_, ids, PrefixMode::kNone);
      if (!kv.ok()) return kv.status();
      out.kv = std::make_shared<const ChunkKv>(*std::move(kv));
      return out;
    }
  }
  if (!found) {  // kAlways looks inside GetOrCompute
    res = store_->GetOrCompute(
        key,
        [&]() -> absl::StatusOr<std::string> {
          absl::StatusOr<ChunkKv> kv = PrefillChunk(*model_, ids, PrefixMode::kNone);
          if (!kv.ok()) return kv.status();
          return EncodeChunkRecord(*model_, *kv, PrefixMode::kNone, lossless);
        },
        /*just_missed=*/policy != PrefixStorePolicy::kAlways);
    if (!res.ok()) return res.status();
  }
  absl::StatusOr<std::shared_ptr<const ChunkKv>> kv =
      DecodeChunkRecord(*model_, res->value->record(), PrefixMode::kNone, res->value);
  if (!kv.ok()) {
    return absl::Status(kv.status().code(), absl::StrCat("prefix: ", kv.status().message()));
  }
  out.kv = *std::move(kv);
  out.cached = !res->computed;
  return out;
}

absl::StatusOr<ResolvedChunks> ChunkResolver::Resolve(const std::vector<ChunkRef>& refs,
                                                      PrefixMode mode,
                                                      const ContextCheck& check_context) const {
  ResolvedChunks out;
  out.chunks.resize(refs.size());
  out.keys_hex.resize(refs.size());
  // Keys first, batched; texts go through GetOrCompute (write-through).
  std::vector<store::ChunkKey> keys;
  std::vector<size_t> key_index;
  for (size_t i = 0; i < refs.size(); ++i) {
    if (!refs[i].by_key) continue;
    absl::StatusOr<store::ChunkKey> key = store::ChunkKey::FromHex(refs[i].key_hex);
    if (!key.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunks[", i, "].key: expected 64 hex digits, got ", QuotedValue(refs[i].key_hex)));
    }
    keys.push_back(*key);
    key_index.push_back(i);
  }
  std::vector<std::string> missing;
  std::vector<absl::StatusOr<store::GetResult>> got = store_->MultiGet(keys);
  for (size_t j = 0; j < keys.size(); ++j) {
    const size_t i = key_index[j];
    out.keys_hex[i] = keys[j].Hex();
    if (!got[j].ok()) return got[j].status();
    if (got[j]->status != store::GetStatus::kFound) {
      missing.push_back(out.keys_hex[i]);
      continue;
    }
    absl::StatusOr<std::shared_ptr<const ChunkKv>> kv =
        DecodeChunkRecord(*model_, got[j]->value->record(), mode, got[j]->value);
    if (!kv.ok()) {
      return absl::Status(kv.status().code(), absl::StrCat("chunks[", i, "]: ", kv.status().message()));
    }
    out.chunks[i] = *std::move(kv);
    ++out.hits;
    if (got[j]->from_remote) ++out.remote_hits;
  }
  if (!missing.empty()) {
    return absl::NotFoundError(
        absl::StrCat("chunks: ", missing.size(), " key(s) not stored: ", absl::StrJoin(missing, ", ")));
  }
  // Tokenize every text first: a query over the context limit is refused
  // before anything is prefilled or stored.
  std::vector<std::vector<int32_t>> text_ids(refs.size());
  int64_t total = 0;
  for (size_t i = 0; i < refs.size(); ++i) {
    if (refs[i].by_key) {
      total += out.chunks[i]->size();
      continue;
    }
    absl::StatusOr<std::vector<int32_t>> ids =
        ChunkTokens(refs[i].text, absl::StrCat("chunks[", i, "].text"), refs[i].parse_special);
    if (!ids.ok()) return ids.status();
    total += static_cast<int64_t>(ids->size());
    text_ids[i] = *std::move(ids);
  }
  if (check_context) {
    if (absl::Status s = check_context(total); !s.ok()) return s;
  }
  // All text chunks' keys in one lookup first: with a shared tier the local
  // misses are fetched from the cluster in parallel, not one by one; what
  // is still missing is prefilled below without asking the cluster again.
  std::vector<store::ChunkKey> text_keys;
  std::vector<size_t> text_index;
  for (size_t i = 0; i < refs.size(); ++i) {
    if (refs[i].by_key) continue;
    text_keys.push_back(ChunkKeyFor(*model_, text_ids[i], mode, codec_));
    text_index.push_back(i);
  }
  std::vector<absl::StatusOr<store::GetResult>> text_got = store_->MultiGet(text_keys);
  for (size_t j = 0; j < text_keys.size(); ++j) {
    const size_t i = text_index[j];
    const std::string field = absl::StrCat("chunks[", i, "].text");
    const std::vector<int32_t>& ids = text_ids[i];
    const store::ChunkKey& key = text_keys[j];
    out.keys_hex[i] = key.Hex();
    if (!text_got[j].ok()) return text_got[j].status();
    absl::StatusOr<store::GetResult> res =
        text_got[j]->status == store::GetStatus::kFound
            ? std::move(text_got[j])
            : store_->GetOrCompute(
                  key,
                  [&]() -> absl::StatusOr<std::string> {
                    absl::StatusOr<ChunkKv> kv = PrefillChunk(*model_, ids, mode);
                    if (!kv.ok()) return kv.status();
                    return EncodeChunkRecord(*model_, *kv, mode, codec_);
                  },
                  /*just_missed=*/true);
    if (!res.ok()) return res.status();
    absl::StatusOr<std::shared_ptr<const ChunkKv>> kv =
        DecodeChunkRecord(*model_, res->value->record(), mode, res->value);
    if (!kv.ok()) {
      return absl::Status(kv.status().code(), absl::StrCat(field, ": ", kv.status().message()));
    }
    out.chunks[i] = *std::move(kv);
    if (res->computed) {
      ++out.misses;
      out.prefilled_tokens += static_cast<int64_t>(ids.size());
    } else {
      ++out.hits;
      if (res->from_remote) ++out.remote_hits;
    }
  }
  for (const auto& c : out.chunks) out.context_tokens += c->size();
  return out;
}

}  // namespace infoflow::server
