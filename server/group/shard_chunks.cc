#include "server/group/shard_chunks.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cache_store/chunk_store.h"
#include "engine/chunk/chunk_codec.h"

namespace infoflow::server {
namespace {

// The chunk's KV from `value` (a verified record of this model and mode), or
// null when it is of another model or prefix mode.
std::shared_ptr<const ChunkKv> Decode(const Model& model,
                                      const std::shared_ptr<const store::ChunkValue>& value,
                                      PrefixMode mode, const std::string& key_hex) {
  absl::StatusOr<std::shared_ptr<const ChunkKv>> kv =
      DecodeChunkRecord(model, value->record(), mode, value);
  if (!kv.ok()) {
    std::fprintf(stderr, "event=group_chunk_refused key=%s reason=\"%s\"\n", key_hex.c_str(),
                 std::string(kv.status().message()).c_str());
    return nullptr;
  }
  return *kv;
}

}  // namespace

absl::StatusOr<SharedShard> ShareChunks(SequenceParallelGroup* group, const Model& model,
                                        store::ChunkStore* store, const ShardLayout& layout,
                                        const std::vector<std::string>& keys_hex, PrefixMode mode,
                                        const std::vector<std::shared_ptr<const ChunkKv>>* all) {
  const int me = group->rank(), n = group->world_size();
  const int begin = layout.chunk_begin[me], end = layout.chunk_end[me];
  const int n_chunks = static_cast<int>(keys_hex.size());
  SharedShard out;
  out.local.resize(end - begin);

  // 1. Each rank looks its own chunks up.
  at::Tensor missing = at::zeros({end - begin}, at::kChar);
  if (me == 0) {
    for (int i = begin; i < end; ++i) out.local[i - begin] = (*all)[i];
  } else {
    std::vector<store::ChunkKey> keys;
    std::vector<bool> parsed(end - begin, false);
    for (int i = begin; i < end; ++i) {
      absl::StatusOr<store::ChunkKey> k = store::ChunkKey::FromHex(keys_hex[i]);
      parsed[i - begin] = k.ok();
      keys.push_back(k.ok() ? *k : store::ChunkKey{});
    }
    std::vector<absl::StatusOr<store::GetResult>> got = store->MultiGet(keys);
    for (int j = 0; j < end - begin; ++j) {
      if (parsed[j] && got[j].ok() && got[j]->status == store::GetStatus::kFound) {
        out.local[j] = Decode(model, got[j]->value, mode, keys_hex[begin + j]);
      }
      if (out.local[j] != nullptr) {
        ++out.from_store;
      } else {
        missing.data_ptr<int8_t>()[j] = 1;
      }
    }
  }

  // 2. Everyone learns who lacks what.
  std::vector<int64_t> rows(n);
  for (int r = 0; r < n; ++r) rows[r] = layout.chunk_end[r] - layout.chunk_begin[r];
  absl::StatusOr<std::vector<at::Tensor>> lacks = group->AllGather(missing, rows);
  if (!lacks.ok()) return lacks.status();
  std::vector<int> owner(n_chunks, -1);
  bool any = false;
  for (int r = 0; r < n; ++r) {
    const int8_t* m = (*lacks)[r].data_ptr<int8_t>();
    for (int j = 0; j < rows[r]; ++j) {
      if (m[j] != 0) {
        owner[layout.chunk_begin[r] + j] = r;
        any = true;
      }
    }
  }
  if (!any) return out;

  // 3. Rank 0 reads the records they lack from its store and says how large
  // each is (0: it has no intact copy either; the owner's entry stays null).
  at::Tensor sizes = at::zeros({n_chunks}, at::kLong);
  std::vector<at::Tensor> payload(n_chunks);
  if (me == 0) {
    for (int i = 0; i < n_chunks; ++i) {
      if (owner[i] < 0) continue;
      absl::StatusOr<store::ChunkKey> k = store::ChunkKey::FromHex(keys_hex[i]);
      absl::StatusOr<store::GetResult> got =
          k.ok() ? store->Get(*k) : absl::StatusOr<store::GetResult>(k.status());
      if (!got.ok() || got->status != store::GetStatus::kFound) {
        std::fprintf(stderr, "event=group_record_unavailable key=%s rank=%d\n", keys_hex[i].c_str(),
                     owner[i]);
        continue;
      }
      const std::string& bytes = got->value->bytes();
      // A copy the exchange owns: a broken exchange may leave Gloo holding it.
      payload[i] = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
      std::memcpy(payload[i].data_ptr<uint8_t>(), bytes.data(), bytes.size());
      sizes.data_ptr<int64_t>()[i] = static_cast<int64_t>(bytes.size());
      out.record_bytes_sent += static_cast<int64_t>(bytes.size());
    }
  }
  if (absl::Status s = group->Broadcast(&sizes, 0); !s.ok()) return s;

  // 4. The records go point to point, rank 0 to each owner.
  std::vector<std::pair<int, at::Tensor>> sends(n_chunks), recvs(n_chunks);
  const int64_t* sz = sizes.data_ptr<int64_t>();
  for (int i = 0; i < n_chunks; ++i) {
    if (owner[i] < 0 || sz[i] == 0) continue;
    if (me == 0) {
      sends[i] = {owner[i], payload[i]};
    } else if (owner[i] == me) {
      payload[i] = at::empty({sz[i]}, at::kByte);
      recvs[i] = {0, payload[i]};
    }
  }
  if (absl::Status s = group->Exchange(sends, recvs); !s.ok()) return s;
  if (me == 0) return out;

  // 5. The owner verifies each record like a disk read, keeps it, uses it.
  for (int i = begin; i < end; ++i) {
    if (owner[i] != me || sz[i] == 0) continue;
    std::string bytes(reinterpret_cast<const char*>(payload[i].data_ptr<uint8_t>()),
                      static_cast<size_t>(sz[i]));
    out.record_bytes_received += sz[i];
    absl::StatusOr<store::ChunkKey> key = store::ChunkKey::FromHex(keys_hex[i]);
    if (!key.ok()) continue;
    if (absl::StatusOr<store::PutResult> put = store->Put(*key, bytes); !put.ok()) {
      // Still usable for this query if it verifies below; the next query asks
      // again.
      std::fprintf(stderr, "event=group_record_not_stored key=%s reason=\"%s\"\n",
                   keys_hex[i].c_str(), std::string(put.status().message()).c_str());
    }
    absl::StatusOr<std::shared_ptr<const store::ChunkValue>> value =
        store::ChunkValue::Create(std::move(bytes));
    if (!value.ok() || (*value)->record().Key() != *key) {
      std::fprintf(stderr, "event=group_record_corrupt key=%s reason=\"%s\"\n", keys_hex[i].c_str(),
                   value.ok() ? "the record is of another key"
                              : std::string(value.status().message()).c_str());
      continue;
    }
    out.local[i - begin] = Decode(model, *value, mode, keys_hex[i]);
    if (out.local[i - begin] != nullptr) ++out.from_rank0;
  }
  return out;
}

}  // namespace infoflow::server
