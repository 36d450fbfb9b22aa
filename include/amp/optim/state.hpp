#pragma once
// An optimizer's own memory for one role of one model: the rule's state
// buffers (moments), per-element group ids when there are groups, and a
// per-tensor rule's chunks and their partial sums. Under ZeRO-1 it covers
// this rank's shard of the role: element k is element shard_begin() + k.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "amp/backend/algorithm.hpp"
#include "amp/backend/buffer.hpp"
#include "amp/model/parameters.hpp"
#include "amp/optim/options.hpp"
#include "amp/optim/step.hpp"

namespace amp::optim {

template <Policy P, Backend B, nn::role R, class Rule>
struct RoleState {
  static constexpr nn::role kind = R;
  using Arena = nn::RoleArena<P, B, R>;
  Arena* arena = nullptr;
  Buffer<float, B> state[2];
  Buffer<std::uint8_t, B> ids;
  Buffer<TensorChunk, B> chunks;
  Buffer<float, B> sums;

  RoleState(Context<B>& ctx, nn::ParameterStore<P, B>& store, const std::vector<ParamGroup>& groups)
      : arena(&store.template arena<R>()) {
    const std::size_t count = arena->shard_count(), begin = arena->shard_begin();
    for (int k = 0; k < Rule::state_buffers; ++k) {
      state[k] = Buffer<float, B>(ctx, count, memory_kind::optimizer);
      fill(ctx, state[k].span(), 0.0f);
    }
    if constexpr (per_tensor_rule<Rule>) init_chunks(ctx, store);
    if (groups.empty() || !count) return;  // per-element group ids only when there are groups
    std::vector<std::uint8_t> host_ids(count, 0);
    for (const auto& p : store.table()) {
      const nn::Part q = store.part(p);  // ZeRO-1: the elements in this rank's shard
      if (p.kind != R || !q.size()) continue;
      for (std::size_t k = 0; k < groups.size(); ++k)
        if (groups[k].select && groups[k].select(p)) {
          std::fill_n(host_ids.begin() + static_cast<std::ptrdiff_t>(p.offset + q.begin - begin), q.size(),
                      static_cast<std::uint8_t>(k + 1));
          break;
        }
    }
    ids = Buffer<std::uint8_t, B>(ctx, count, memory_kind::optimizer);
    upload(ctx, ids.span(), host_ids);
  }

 private:
  void init_chunks(Context<B>& ctx, const nn::ParameterStore<P, B>& store) {
    std::vector<TensorChunk> host_chunks;
    for (const auto& p : store.table()) {
      if (p.kind != R || !p.count || !store.part(p).size()) continue;
      AMP_REQUIRE(store.owns(p), Rule::name, ": '", p.name, "' is split between ZeRO-1 shards; its per-tensor norms need "
                  "it whole: build the model with .shard = {rank, ranks, .whole_tensors = true}");
      const auto first = static_cast<std::uint32_t>(host_chunks.size());
      const auto n = static_cast<std::uint32_t>((p.count + tensor_chunk - 1) / tensor_chunk);
      for (std::uint32_t k = 0; k < n; ++k) {
        const std::size_t at = k * tensor_chunk;
        const auto size = static_cast<std::uint32_t>(std::min(tensor_chunk, p.count - at));
        host_chunks.push_back({p.offset - arena->shard_begin() + at, size, first, n});  // from the shard's start
      }
    }
    if (host_chunks.empty()) return;
    chunks = Buffer<TensorChunk, B>(ctx, host_chunks.size(), memory_kind::optimizer);
    upload(ctx, chunks.span(), host_chunks);
    sums = Buffer<float, B>(ctx, 2 * host_chunks.size(), memory_kind::optimizer);
  }
};

}  // namespace amp::optim
