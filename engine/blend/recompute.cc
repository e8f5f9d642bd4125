#include "engine/blend/recompute.h"

#include <ATen/ATen.h>

#include "engine/chunk/chunk_prefill.h"
#include "engine/blend/selection.h"

namespace infoflow {
namespace {

at::Tensor SlotTensor(const Model& model, const std::vector<int64_t>& slots) {
  return at::tensor(slots, at::TensorOptions().dtype(at::kLong)).to(model.device());
}

at::Tensor IdsOf(const Model& model, const std::vector<int32_t>& slot_ids,
                 const std::vector<int64_t>& slots) {
  std::vector<int32_t> ids;
  ids.reserve(slots.size());
  for (int64_t s : slots) ids.push_back(slot_ids[s]);
  return TokenTensor(model, ids);
}

}  // namespace

void RecomputeTokens(const Model& model, KvCache* cache, const std::vector<int32_t>& slot_ids,
                     const std::vector<int64_t>& slots, int first_layer, const at::Tensor& hidden) {
  if (slots.empty() || first_layer >= model.n_layers()) return;
  at::Tensor slot_t = SlotTensor(model, slots);
  at::Tensor positions = cache->positions().index_select(0, slot_t);
  auto rope = model.RopeTables(positions);
  at::Tensor h = hidden.defined() ? hidden : model.Embed(IdsOf(model, slot_ids, slots));
  for (int l = first_layer; l < model.n_layers(); ++l) {
    h = model.Layer(l, h, positions, rope, slot_t, cache);
  }
}

std::vector<int64_t> CacheBlendRecompute(const Model& model, KvCache* cache,
                                         const std::vector<int32_t>& slot_ids, int64_t begin,
                                         int64_t end, int64_t k, Deviation deviation,
                                         Layer1Update update) {
  std::vector<int64_t> all(end - begin);
  for (int64_t i = 0; i < end - begin; ++i) all[i] = begin + i;
  at::Tensor slot_t = SlotTensor(model, all);
  at::Tensor positions = cache->positions().index_select(0, slot_t);
  auto rope = model.RopeTables(positions);

  // Layer 0 K/V depend only on token and position, so recomputing them for
  // every token changes nothing in the cache; it yields layer 1's input.
  at::Tensor h = model.Embed(IdsOf(model, slot_ids, all));
  h = model.Layer(0, h, positions, rope, slot_t, cache);
  const int check_layer = std::min(1, model.n_layers() - 1);
  at::Tensor old_k = cache->keys(check_layer).index_select(1, slot_t).clone();
  at::Tensor old_v = cache->values(check_layer).index_select(1, slot_t).clone();
  if (check_layer == 1) h = model.Layer(1, h, positions, rope, slot_t, cache);
  at::Tensor now = (deviation == Deviation::kV ? cache->values(check_layer)
                                               : cache->keys(check_layer))
                       .index_select(1, slot_t);
  at::Tensor before = deviation == Deviation::kV ? old_v : old_k;
  at::Tensor dev = (now.to(at::kDouble) - before.to(at::kDouble)).pow(2).sum(at::IntArrayRef{0, 2});
  std::vector<int64_t> chosen = SelectTopK(dev, k);

  // kSelected: only the selected tokens keep their fresh layer-1 K/V
  // (LMCache's selective update): r = 0 is then exactly NONE. kAll keeps
  // them all, as CacheBlend's own code does.
  std::vector<bool> keep(all.size(), update == Layer1Update::kAll);
  for (int64_t c : chosen) keep[c] = true;
  std::vector<int64_t> restore_rows, restore_slots;
  for (size_t i = 0; i < all.size(); ++i) {
    if (!keep[i]) restore_rows.push_back(static_cast<int64_t>(i)), restore_slots.push_back(all[i]);
  }
  if (!restore_rows.empty() && check_layer == 1) {
    at::Tensor rows = SlotTensor(model, restore_rows);
    cache->WriteAt(check_layer, SlotTensor(model, restore_slots), old_k.index_select(1, rows),
                   old_v.index_select(1, rows));
  }

  std::vector<int64_t> slots;
  for (int64_t c : chosen) slots.push_back(begin + c);
  if (!slots.empty() && check_layer + 1 < model.n_layers()) {
    at::Tensor rows = at::tensor(chosen, at::TensorOptions().dtype(at::kLong)).to(model.device());
    RecomputeTokens(model, cache, slot_ids, slots, check_layer + 1, h.index_select(0, rows));
  }
  return chosen;
}

at::Tensor LayerZeroOutput(const Model& model, KvCache* cache, const std::vector<int32_t>& slot_ids,
                           const std::vector<int64_t>& slots) {
  at::Tensor slot_t = SlotTensor(model, slots);
  at::Tensor positions = cache->positions().index_select(0, slot_t);
  auto rope = model.RopeTables(positions);
  return model.Layer(0, model.Embed(IdsOf(model, slot_ids, slots)), positions, rope, slot_t,
                     cache);
}

at::Tensor Layer1DeviationAtLayerZeroCost(const Model& model, KvCache* cache,
                                          const std::vector<int32_t>& slot_ids,
                                          const std::vector<int64_t>& slots, Deviation deviation,
                                          at::Tensor* layer1_input) {
  const int64_t n = static_cast<int64_t>(slots.size());
  at::Tensor zeros = at::zeros({n}, at::TensorOptions().dtype(at::kDouble));
  if (n == 0) return zeros;
  at::Tensor slot_t = SlotTensor(model, slots);
  at::Tensor positions = cache->positions().index_select(0, slot_t);
  auto rope = model.RopeTables(positions);
  at::Tensor h = LayerZeroOutput(model, cache, slot_ids, slots);
  *layer1_input = h;
  if (model.n_layers() < 2) return zeros;
  auto [k, v] = model.LayerKv(1, h, rope);
  at::Tensor fresh = deviation == Deviation::kV ? v : k;
  at::Tensor cached =
      (deviation == Deviation::kV ? cache->values(1) : cache->keys(1)).index_select(1, slot_t);
  return (fresh.to(at::kDouble) - cached.to(at::kDouble)).pow(2).sum(at::IntArrayRef{0, 2}).cpu();
}

}  // namespace infoflow
