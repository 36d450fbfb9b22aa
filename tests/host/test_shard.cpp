// ZeRO-1's partition, in one process (tests/parallel runs it over MPI ranks):
// the shards of every rank count cover each arena once, evenly or at tensor
// starts, and a store built as one rank's shard keeps masters for it alone.
#include <doctest/doctest.h>

#include "amp/amp.hpp"

using namespace amp;

TEST_CASE("shard_bounds: even cuts at blocks through tensors, or the nearest tensor starts") {
  const std::vector<std::size_t> starts{0, 640, 768, 1024};  // tensors of 640, 128, 256, 128 elements
  CHECK(nn::shard_bounds(starts, 1152, 1, false, 128) == std::vector<std::size_t>{0, 1152});
  CHECK(nn::shard_bounds(starts, 1152, 2, false, 128) == std::vector<std::size_t>{0, 512, 1152});
  CHECK(nn::shard_bounds(starts, 1152, 3, false, 128) == std::vector<std::size_t>{0, 384, 768, 1152});
  CHECK(nn::shard_bounds(starts, 1152, 2, true, 128) == std::vector<std::size_t>{0, 640, 1152});
  CHECK(nn::shard_bounds(starts, 1152, 3, true, 128) == std::vector<std::size_t>{0, 640, 768, 1152});
  // More ranks than tensors: the later ranks keep nothing, never a negative range.
  CHECK(nn::shard_bounds({0}, 128, 3, true, 128) == std::vector<std::size_t>{0, 0, 128, 128});
  CHECK(nn::shard_bounds({0}, 128, 3, false, 128) == std::vector<std::size_t>{0, 0, 0, 128});
  // A tensor's parts over the ranks tile it.
  const auto b = nn::shard_bounds(starts, 1152, 3, false, 128);
  CHECK(nn::part_in_shard(0, 640, b, 0).size() == 384);
  CHECK(nn::part_in_shard(0, 640, b, 1).begin == 384);
  CHECK(nn::part_in_shard(0, 640, b, 1).end == 640);
  CHECK(nn::part_in_shard(0, 640, b, 2).size() == 0);
}

TEST_CASE_TEMPLATE("a store built as one rank's shard: masters of the shard, parts tiling every parameter", P, O0Policy,
                   O2Policy) {
  Context<host> ctx(1);
  for (int ranks : {2, 3, 5})
    for (bool whole : {false, true})
      for (int rank = 0; rank < ranks; ++rank) {
        CAPTURE(ranks);
        CAPTURE(whole);
        CAPTURE(rank);
        nn::ParameterStore<P, host> store(ctx);
        const std::int64_t sizes[] = {1000, 7, 300, 4000, 1};
        const char* names[] = {"a", "b", "c", "d", "e"};
        for (int k = 0; k < 5; ++k) store.template declare<nn::role::weight>(names[k], {sizes[k]}, nn::Init::constant(1.0f));
        store.template declare<nn::role::norm>("g", {64}, nn::Init::constant(1.0f));
        store.allocate({rank, ranks, whole});
        const auto& a = store.template arena<nn::role::weight>();
        const auto& bounds = store.template shard_bounds<nn::role::weight>();
        CHECK(a.shard_begin() == bounds[static_cast<std::size_t>(rank)]);
        CHECK(a.master().size == (nn::RoleArena<P, host, nn::role::weight>::has_master ? a.shard_count() : 0));
        for (const auto& p : store.table()) {
          std::size_t covered = 0;
          for (int r = 0; r < ranks; ++r) covered += store.part(p, r).size();
          CHECK(covered == p.count);
          if (whole) CHECK((store.part(p).size() == 0 || store.owns(p)));
        }
        if (!whole) CHECK(a.shard_count() <= (a.count() / 128 + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks) * 128);
      }
}
