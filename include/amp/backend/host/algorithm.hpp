#pragma once
// The host twins of the CUDA launches: the same functor, run in an OpenMP loop.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "amp/backend/groups.hpp"
#include "amp/backend/rows.hpp"
#include "amp/backend/host/context.hpp"
#include "amp/backend/host/convert.hpp"
#include "amp/core/error.hpp"
#include "amp/core/span.hpp"

namespace amp {

namespace detail {
// Below this much work (items x their elements) a parallel region costs more than it saves.
inline constexpr std::int64_t host_parallel_threshold = 1 << 14;
// Reductions combine fixed chunks in a fixed order: the same bits for any thread count.
inline constexpr std::size_t host_reduce_chunk = 4096;

template <class F>
AMP_HOST_CLONES void for_each_now(int threads, std::size_t n, F f, std::size_t work_per_item) {
  const auto count = static_cast<std::int64_t>(n);
#pragma omp parallel for num_threads(threads) schedule(static) \
    if (count * static_cast<std::int64_t>(work_per_item) >= host_parallel_threshold)
  for (std::int64_t i = 0; i < count; ++i) f(static_cast<std::size_t>(i));
}
}  // namespace detail

// f(i) for every i in [0, n); an item that loops over work_per_item elements
// (a row, a pixel's channels) counts as that many for the parallel threshold.
template <class F>
void for_each(Context<host>& ctx, std::size_t n, F f, std::size_t work_per_item = 1) {
  if (n == 0) return;
  ctx.count_launch();
  ctx.issue([threads = ctx.threads(), n, f, work_per_item] { detail::for_each_now(threads, n, f, work_per_item); });
}

namespace detail {
template <class F>
AMP_HOST_CLONES void for_each_cell_now(int threads, std::int64_t rows, std::int64_t cols, F f, std::int64_t work) {
#pragma omp parallel for collapse(2) num_threads(threads) schedule(static) if (rows * cols * work >= host_parallel_threshold)
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) f(r, c);
}
}  // namespace detail

// f(r, c) for every cell of a rows x cols grid (the GPU's twin divides no
// index); work_per_item as for for_each.
template <class F>
void for_each_cell(Context<host>& ctx, std::int64_t rows, std::int64_t cols, F f, std::size_t work_per_item = 1) {
  if (rows <= 0 || cols <= 0) return;
  ctx.count_launch();
  ctx.issue([threads = ctx.threads(), rows, cols, f, work = static_cast<std::int64_t>(work_per_item)] {
    detail::for_each_cell_now(threads, rows, cols, f, work);
  });
}

namespace detail {
template <class Op>
struct RowAsItem {
  Op op;
  void operator()(std::size_t r) const { op(SerialLanes{}, r); }
};
}  // namespace detail

// op(lanes, r) for every row r of width values (backend/rows.hpp): one thread a row here.
template <class Op>
void for_each_row(Context<host>& ctx, std::size_t rows, std::int64_t width, Op op) {
  for_each(ctx, rows, detail::RowAsItem<Op>{op}, static_cast<std::size_t>(width));
}

namespace detail {
// The launches of a body after a prologue (see after_prologue): counted as
// the GPU issues them, or run now, inside the prologue's launch.
struct CountLaunches {
  Context<host>* ctx;
  template <class F>
  void each(std::size_t n, F) const {
    if (n) ctx->count_launch();
  }
  template <class Op>
  void rows(std::size_t rows, std::int64_t, Op) const {
    if (rows) ctx->count_launch();
  }
};
struct LaunchNow {
  int threads;
  template <class F>
  void each(std::size_t n, F f) const {
    if (n) for_each_now(threads, n, f, 1);
  }
  template <class Op>
  void rows(std::size_t rows, std::int64_t width, Op op) const {
    if (rows) for_each_now(threads, rows, RowAsItem<Op>{op}, static_cast<std::size_t>(width));
  }
};
}  // namespace detail

// A one-item prologue, then launches that read its value (an optimizer step:
// its values from the verdict, then the passes): *slot = prologue(), then
// body(launch, values) issues launch.each(n, f) and launch.rows(rows, width,
// op). Here the prologue runs on the host inside the one launch, and the
// body gets its value by value (so its loops vectorise and a skipped step can
// launch nothing); the GPU's twin passes a pointer to *slot.
template <class T, class Prologue, class Body>
void after_prologue(Context<host>& ctx, T* slot, Prologue prologue, Body body) {
  ctx.count_launch();
  body(detail::CountLaunches{&ctx}, T{});
  ctx.issue([threads = ctx.threads(), slot, prologue, body] {
    const T v = prologue();
    *slot = v;
    body(detail::LaunchNow{threads}, v);
  });
}

// Sizes the workspace of a transform_reduce of n items of T now (a model's
// build), so that the reductions of a training step allocate nothing.
template <class T>
void reserve_reduction(Context<host>& ctx, std::size_t n) {
  ctx.scratch<T>(scratch_slot::partials, (n + detail::host_reduce_chunk - 1) / detail::host_reduce_chunk);
}

// out[i] = cast<To>(in[i]) in parallel chunks, with the CPU's conversion
// instructions (convert.hpp); the same bits as the per-element cast.
template <class From, class To>
void convert(Context<host>& ctx, Span<const From> in, Span<To> out) {
  AMP_REQUIRE(in.size == out.size, "convert: ", in.size, " elements into ", out.size);
  if (in.size == 0) return;
  ctx.count_launch();
  ctx.issue([threads = ctx.threads(), in, out] {
    constexpr std::size_t chunk = 1 << 14;
    const auto chunks = static_cast<std::int64_t>((in.size + chunk - 1) / chunk);
#pragma omp parallel for num_threads(threads) schedule(static) if (chunks > 1)
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::size_t begin = static_cast<std::size_t>(c) * chunk;
      detail::convert_n(in.data + begin, out.data + begin, std::min(chunk, in.size - begin));
    }
  });
}

namespace detail {
// combine over map(i), i in [begin, end), from init: a combine that knows a
// faster fold of a run on the CPU (fold(map, begin, end): the gradient
// statistics' fields as separate vector reductions) gives the same value up
// to the order of its sums.
template <class T, class Map, class Combine>
T fold(const Map& map, const Combine& combine, T init, std::size_t begin, std::size_t end) {
  if constexpr (requires { combine.fold(map, begin, end); }) {
    return begin < end ? combine(init, combine.fold(map, begin, end)) : init;
  } else {
    T acc = init;
    for (std::size_t i = begin; i < end; ++i) acc = combine(acc, map(i));
    return acc;
  }
}

template <class T, class Map, class Combine>
AMP_HOST_CLONES void transform_reduce_now(int threads, std::size_t n, Map map, Combine combine, T init, T* out,
                                          T* partial) {
  const std::size_t chunk = host_reduce_chunk;
  const std::size_t chunks = (n + chunk - 1) / chunk;
  if (chunks <= 1) {
    *out = fold(map, combine, init, 0, n);
    return;
  }
  const auto count = static_cast<std::int64_t>(chunks);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t c = 0; c < count; ++c) {
    const std::size_t begin = static_cast<std::size_t>(c) * chunk;
    partial[c] = fold(map, combine, init, begin, begin + chunk < n ? begin + chunk : n);
  }
  T acc = init;
  for (std::size_t c = 0; c < chunks; ++c) acc = combine(acc, partial[c]);
  *out = acc;
}

template <class T, class Map, class Combine>
AMP_HOST_CLONES void segmented_transform_reduce_now(int threads, std::size_t segments, const std::size_t* begins,
                                                    const std::size_t* ends, Map map, Combine combine, T init, T* out) {
  const auto count = static_cast<std::int64_t>(segments);
#pragma omp parallel for num_threads(threads) schedule(static) if (count > 1)
  for (std::int64_t k = 0; k < count; ++k) out[k] = fold(map, combine, init, begins[k], ends[k]);
}
}  // namespace detail

// out[k] = combine over map(i), i in [begins[k], ends[k]), for each segment
// k (begins and ends in host memory here, device memory on the GPU): a
// thread a segment here, a block a segment (CUB's) on the GPU.
template <class T, class Map, class Combine>
void segmented_transform_reduce(Context<host>& ctx, std::size_t segments, const std::size_t* begins,
                                const std::size_t* ends, Map map, Combine combine, T init, T* out) {
  if (segments == 0) return;
  ctx.count_launch();
  ctx.issue([threads = ctx.threads(), segments, begins, ends, map, combine, init, out] {
    detail::segmented_transform_reduce_now(threads, segments, begins, ends, map, combine, init, out);
  });
}

// *out = combine(... combine(init, map(0)) ..., map(n-1)), written to `out`
// (host memory here, device memory on the CUDA twin) so no caller has to sync.
template <class T, class Map, class Combine>
void transform_reduce(Context<host>& ctx, std::size_t n, Map map, Combine combine, T init, T* out) {
  ctx.count_launch();
  const std::size_t chunks = (n + detail::host_reduce_chunk - 1) / detail::host_reduce_chunk;
  T* partial = chunks > 1 ? ctx.scratch<T>(scratch_slot::partials, chunks) : nullptr;
  ctx.issue([threads = ctx.threads(), n, map, combine, init, out, partial] {
    detail::transform_reduce_now(threads, n, map, combine, init, out, partial);
  });
}

// group_by_key's workspace (backend/groups.hpp): one 64-bit (key, row) pair per row.
inline std::size_t group_by_key_bytes(Context<host>&, std::size_t n) { return n * sizeof(std::uint64_t); }

// Groups rows by key (backend/groups.hpp): one sort of (key, row) pairs, so
// rows of a key stay in row order.
inline void group_by_key(Context<host>& ctx, const std::int32_t* keys, std::size_t n, KeyGroups out, void* temp) {
  AMP_REQUIRE(n < static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()), "group_by_key: ", n,
              " rows do not fit int32 indices");
  ctx.count_launch();
  ctx.issue([keys, n, out, pairs = static_cast<std::uint64_t*>(temp)] {
    // The key's bits flipped at the sign: unsigned order is signed order.
    for (std::size_t r = 0; r < n; ++r)
      pairs[r] = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(keys[r]) ^ 0x80000000u) << 32) | r;
    std::sort(pairs, pairs + n);
    std::int32_t groups = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto key = static_cast<std::int32_t>(static_cast<std::uint32_t>(pairs[i] >> 32) ^ 0x80000000u);
      if (i == 0 || key != out.keys[groups - 1]) out.keys[groups] = key, out.offsets[groups++] = static_cast<std::int32_t>(i);
      out.rows[i] = static_cast<std::int32_t>(pairs[i] & 0xffffffffu);
    }
    out.offsets[groups] = static_cast<std::int32_t>(n);
    *out.count = groups;
  });
}

}  // namespace amp
