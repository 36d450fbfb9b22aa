#pragma once
// Data parallel's set-up checks: every rank builds the same model (names,
// shapes, roles), with the shard its ZeRO stage needs, and under ZeRO-1 from
// the same values. Each is collective and names what differs.
#include <cstdint>
#include <type_traits>
#include <vector>

#include "amp/backend/collective.hpp"
#include "amp/model/parameters.hpp"

namespace amp::parallel::detail {

// One FNV-1a step: the set-up checks' fingerprints of what every rank holds.
inline constexpr std::uint64_t fnv_basis = 1469598103934665603ull;
inline std::uint64_t fnv1a(std::uint64_t hash, std::uint64_t v) { return (hash ^ v) * 1099511628211ull; }

// Every rank must hold the same model: the same parameters, shapes and roles.
template <Backend B, class Store>
void check_same_model(Collective<B>& comm, const std::vector<Store*>& stores) {
  std::vector<std::int64_t> mine;
  for (Store* s : stores) {
    std::uint64_t hash = fnv_basis;  // over names, shapes and roles
    auto mix = [&](std::uint64_t v) { hash = fnv1a(hash, v); };
    std::int64_t elements = 0;
    for (const auto& p : s->table()) {
      for (char c : p.name) mix(static_cast<unsigned char>(c));
      for (int d = 0; d < p.shape.rank(); ++d) mix(static_cast<std::uint64_t>(p.shape[d]));
      mix(static_cast<std::uint64_t>(p.kind));
      elements += static_cast<std::int64_t>(p.count);
    }
    mine.insert(mine.end(), {static_cast<std::int64_t>(s->table().size()), elements, static_cast<std::int64_t>(hash)});
  }
  const char* what[] = {"parameters", "elements", "layout hash"};
  const auto ranks = comm.all_gather(static_cast<std::int64_t>(mine.size()));
  for (int r = 0; r < comm.size(); ++r)
    AMP_REQUIRE(ranks[static_cast<std::size_t>(r)] == ranks[0], "DataParallel: rank ", r, " trains ",
                ranks[static_cast<std::size_t>(r)] / 3, " models, rank 0 ", ranks[0] / 3);
  for (std::size_t k = 0; k < mine.size(); ++k) {
    const auto all = comm.all_gather(mine[k]);
    for (int r = 1; r < comm.size(); ++r)
      AMP_REQUIRE(all[static_cast<std::size_t>(r)] == all[0], "DataParallel: the ranks hold different models: rank ", r,
                  " has ", all[static_cast<std::size_t>(r)], " ", what[k % 3], " in model ", k / 3, ", rank 0 has ",
                  all[0], " (every rank must build the same model)");
  }
}

// ZeRO-1 needs models built with this rank's shard; data parallel without it, unsharded ones.
template <Backend B, class Store>
void check_shards(Collective<B>& comm, const std::vector<Store*>& stores, bool zero) {
  for (Store* s : stores) {
    const nn::Shard& sh = s->shard();
    if (zero)
      AMP_REQUIRE(sh.rank == comm.rank() && sh.ranks == comm.size(), "DataParallel(zero = 1): build the model "
                  "with .shard = {", comm.rank(), ", ", comm.size(), "} (this rank of the job); it has shard ",
                  sh.rank, " of ", sh.ranks);
    else
      AMP_REQUIRE(!s->sharded(), "DataParallel: the model is built with a shard (ZeRO-1): construct DataParallel "
                                 "with zero = 1");
  }
}

// ZeRO-1: no rank holds every master to send, so the ranks must start alike
// (the same seed, or the same checkpoint loaded on each): their values and buffers are compared.
template <Backend B, class Store>
void check_same_values(Collective<B>& comm, Context<B>& ctx, const std::vector<Store*>& stores) {
  for (Store* s : stores) {
    std::uint64_t hash = fnv_basis;
    auto mix = [&](auto span) {
      const auto host = download(ctx, Span<const std::remove_const_t<std::remove_reference_t<decltype(*span.data)>>>(span));
      const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
      for (std::size_t i = 0; i < host.size() * sizeof(host[0]); ++i) hash = fnv1a(hash, bytes[i]);
    };
    nn::for_each_trained_role([&](auto r) { mix(s->template arena<decltype(r)::value>().values()); });
    mix(s->buffer_values());
    const auto all = comm.all_gather(static_cast<std::int64_t>(hash));
    for (int r = 1; r < comm.size(); ++r)
      AMP_REQUIRE(all[static_cast<std::size_t>(r)] == all[0], "DataParallel(zero = 1): rank ", r,
                  " starts from other parameter values than rank 0: under ZeRO-1 no rank holds every master to "
                  "send, so build every rank's model with the same seed (or load the same checkpoint on each)");
  }
}

}  // namespace amp::parallel::detail
