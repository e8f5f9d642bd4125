// ChunkResolver: the ingest and fetch stages of docs/DESIGN.md §2.1-2.2 over the
// engine and the store -- text to tokens to key, prefill-once-and-store, and
// a query's chunk list (keys or texts) to ChunkKv, with write-through
// prefill for chunks given as text that are not stored (or stored corrupt).
//
// Thread-safe: the model, tokenizer and store it uses are.
#ifndef INFOFLOW_SERVER_CHUNK_RESOLVER_H_
#define INFOFLOW_SERVER_CHUNK_RESOLVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chunk/kv_codec.h"
#include "server/recent_keys.h"

namespace infoflow {
class Model;
class Tokenizer;
struct ChunkKv;
enum class PrefixMode : uint8_t;
namespace store {
class ChunkStore;
enum class RemoteWriteState : uint8_t;
}
}  // namespace infoflow

namespace infoflow::server {

// Bytes a text may have per allowed token before it is tokenized at all
// (chunk texts, questions, rendered prompts): a cheap bound so that no
// request makes the server tokenize megabytes to find out they are too long.
// Generous: ordinary text runs 3-5 bytes per BPE token.
inline constexpr uint64_t kMaxBytesPerToken = 32;

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or > U+10FFFF).
bool IsValidUtf8(std::string_view s);

// When a query prefix the store lacks is written to it (ResolvePrefix).
// kRepeated suits text that usually appears once, like a conversation's
// history (each turn's is new, and the next turn extends it), but is
// sometimes repeated as is (few-shot examples given as turns).
enum class PrefixStorePolicy : uint8_t { kAlways, kRepeated, kNever };

// One chunk of a query: a stored key (64 hex digits) or text.
struct ChunkRef {
  bool by_key = false;
  std::string key_hex;
  std::string text;
  // Encode special-token spellings in `text` as the special tokens
  // (Tokenizer::Piece::parse_special); false: plain text.
  bool parse_special = false;
};

// A query prefix's KV from the store (ResolvePrefix).
struct ResolvedPrefix {
  std::shared_ptr<const ChunkKv> kv;  // the prefix prefilled alone at 0..n-1
  std::string key_hex;
  bool cached = false;  // served by the store; false: prefilled now (stored per the policy)
};

struct IngestOutcome {
  std::string key_hex;
  int64_t n_tokens = 0;
  bool already_present = false;
  // How far the chunk's shared-tier copy got when Ingest returned (the
  // cluster write is behind the local one: usually kPending).
  store::RemoteWriteState remote_state{};
};

struct ResolvedChunks {
  std::vector<std::shared_ptr<const ChunkKv>> chunks;  // request order
  std::vector<std::string> keys_hex;                   // request order
  int hits = 0;    // served by the store
  int misses = 0;  // prefilled now (text given, not stored or corrupt)
  int remote_hits = 0;  // of hits: fetched from the shared tier
  int64_t prefilled_tokens = 0;
  int64_t context_tokens = 0;
};

class ChunkResolver {
 public:
  // All pointers must outlive the resolver. Chunks longer than
  // `max_chunk_tokens` tokens are refused. New records are written with
  // `codec` (and looked up under its keys).
  ChunkResolver(const Model* model, const Tokenizer* tokenizer, store::ChunkStore* store,
                int64_t max_chunk_tokens, const KvCodec& codec = {});

  // The checks of CheckedTokens that need no tokenizer: InvalidArgument
  // (naming `field`) when the text is empty, not UTF-8, or longer in bytes
  // than max_chunk_tokens can hold.
  absl::Status CheckedText(std::string_view text, const std::string& field) const;

  // The token ids of a text that passed CheckedText (not checked again):
  // InvalidArgument naming `field` when it has no tokens or more than
  // max_chunk_tokens. Ingest checks a batch whole before anything is
  // stored, and tokenizes each text once. `parse_special`: see ChunkRef.
  absl::StatusOr<std::vector<int32_t>> CheckedTokens(std::string_view text,
                                                     const std::string& field,
                                                     bool parse_special = false) const;

  // Ingests one chunk given as CheckedTokens ids: stores its KV unless an
  // intact record exists (already_present).
  absl::StatusOr<IngestOutcome> Ingest(const std::vector<int32_t>& ids, PrefixMode mode) const;

  // Checks a query's context length before anything is prefilled.
  using ContextCheck = std::function<absl::Status(int64_t context_tokens)>;

  // Fetches every chunk of a query (keys and texts each in one batched
  // lookup, so a shared tier fetches them in parallel). NotFound listing every key that is
  // neither stored nor given as text; InvalidArgument for malformed keys or
  // bad texts; FailedPrecondition for records of another model or another
  // prefix mode; whatever `check_context` returns for the total context
  // length (called before any text is prefilled, so a refused query stores
  // nothing).
  absl::StatusOr<ResolvedChunks> Resolve(const std::vector<ChunkRef>& refs, PrefixMode mode,
                                         const ContextCheck& check_context = {}) const;

  // The KV of a query prefix (`ids`, checked by the caller: non-empty, in
  // the vocabulary), prefilled alone at positions 0..n-1 and kept in the
  // store under the key of a PrefixMode::kNone chunk of the same ids with
  // the raw codec: whatever --kv-codec is, a prefix record is lossless, so
  // the prefix stays exact. Single flight through the store: concurrent
  // queries with one new prefix prefill it once. The store's errors as they are.
  // `policy` says when a prefix the store lacks is written (a stored record
  // is always used): kAlways as above; kRepeated only when this resolver saw
  // the same ids in one of its last kRecentPrefixes misses, else prefilled
  // for this query only; kNever: prefilled for this query only. Nothing
  // unwritten enters the RAM tier.
  absl::StatusOr<ResolvedPrefix> ResolvePrefix(
      const std::vector<int32_t>& ids, PrefixStorePolicy policy = PrefixStorePolicy::kAlways) const;

  // How many missed prefix keys kRepeated remembers (FIFO; ~250 B each).
  static constexpr size_t kRecentPrefixes = 16384;

  // Tokens of `text` under the served tokenizer (no post_processor tokens;
  // special-token spellings parsed as special tokens).
  std::vector<int32_t> Tokenize(std::string_view text) const;

 private:
  // CheckedText, then CheckedTokens (a query's text chunks).
  absl::StatusOr<std::vector<int32_t>> ChunkTokens(std::string_view text,
                                                   const std::string& field,
                                                   bool parse_special) const;

  const Model* model_;
  const Tokenizer* tokenizer_;
  store::ChunkStore* store_;
  int64_t max_chunk_tokens_;
  KvCodec codec_;

  // Keys of prefixes missed under kRepeated and not yet stored.
  mutable RecentKeys recent_prefixes_{kRecentPrefixes};
};

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_CHUNK_RESOLVER_H_
