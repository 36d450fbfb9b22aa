#pragma once
// A seeded, shuffling mini-batch loader over images held in host memory. Each
// batch is normalised into pinned host memory (Staging) and copied
// asynchronously on the context's stream into backend buffers planned for the
// batch size, so iterating allocates nothing, does no pageable copy and does
// not wait for the stream. The batch buffers are the same every batch: a
// captured step reads each new batch from them. The last partial batch is kept
// (a smaller batch, not dropped or padded). Batches come flat [N, rows*cols]
// (for an MLP) or as channels-last images [N, rows, cols, 1].
//
// Data parallel (shard = {rank, ranks}): every rank draws the same permutation
// (same seed) and global batch b holds batch_size x ranks samples of it; rank
// r takes the r-th slice. So the ranks' batches together are exactly the batch
// of one process with batch_size x ranks, in the same order. The last partial
// global batch is split as evenly as it goes (the first ranks take one more),
// and kept as in one process while it gives every rank a sample.
#include <algorithm>
#include <cmath>
#include <utility>
#include <cstdint>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "amp/backend/buffer.hpp"
#include "amp/backend/staging.hpp"
#include "amp/backend/host/convert.hpp"
#include "amp/core/numeric.hpp"
#include "amp/data/idx.hpp"
#include "amp/tensor.hpp"

namespace amp::data {

enum class Layout { flat, image };

template <Scalar T, Backend B>
class Loader {
 public:
  struct Options {
    std::int64_t batch_size = 128;
    bool shuffle = true;
    std::uint64_t seed = 0;
    float mean = 0.0f;  // normalisation of pixel / 255
    float stddev = 1.0f;
    Layout layout = Layout::flat;
    int rank = 0;   // data parallel: this rank's shard of each global batch
    int ranks = 1;
  };

  Loader(Context<B>& ctx, const LabelledImages& set, Options opt)
      : ctx_(&ctx),
        set_(&set),
        opt_(opt),
        features_(set.rows * set.cols),
        order_(static_cast<std::size_t>(set.count)),
        row_(static_cast<std::size_t>(features_)),
        stage_x_(ctx, static_cast<std::size_t>(opt.batch_size * features_)),
        stage_y_(ctx, static_cast<std::size_t>(opt.batch_size)),
        x_(ctx, static_cast<std::size_t>(opt.batch_size * features_), memory_kind::data),
        y_(ctx, static_cast<std::size_t>(opt.batch_size), memory_kind::data),
        gen_(opt.seed) {
    AMP_REQUIRE(opt.batch_size > 0, "Loader: batch_size must be positive, got ", opt.batch_size);
    AMP_REQUIRE(opt.stddev > 0, "Loader: stddev must be positive");
    AMP_REQUIRE(opt.ranks >= 1 && opt.rank >= 0 && opt.rank < opt.ranks, "Loader: rank ", opt.rank, " of ", opt.ranks,
                " ranks");
    AMP_REQUIRE(set.count >= opt.ranks, "Loader: ", set.count, " samples cannot give each of ", opt.ranks,
                " ranks one");
    std::iota(order_.begin(), order_.end(), 0);
  }

  // Batches per epoch (global batches, the same count on every rank).
  std::int64_t batches() const {
    const std::int64_t global = opt_.batch_size * opt_.ranks, full = set_->count / global;
    return full + (set_->count % global >= opt_.ranks ? 1 : 0);
  }
  std::int64_t features() const { return features_; }
  std::int64_t size() const { return set_->count; }

  // Starts an epoch: a new permutation when shuffling.
  void start_epoch() {
    if (opt_.shuffle) std::shuffle(order_.begin(), order_.end(), gen_);
  }

  struct Batch {
    TensorView<const T> x;
    Span<const std::int32_t> labels;
  };

  Batch batch(std::int64_t b) {
    AMP_REQUIRE(b >= 0 && b < batches(), "Loader: batch ", b, " of ", batches());
    const auto [begin, rows] = shard(b);
    T* x = stage_x_.next().data;
    std::int32_t* y = stage_y_.next().data;
    const float a = 1.0f / (255.0f * opt_.stddev), c = -opt_.mean / opt_.stddev;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t src = order_[static_cast<std::size_t>(begin + r)];
      const std::uint8_t* p = set_->pixels.data() + src * features_;
      for (std::int64_t i = 0; i < features_; ++i) row_[static_cast<std::size_t>(i)] = static_cast<float>(p[i]) * a + c;
      amp::detail::convert_n(row_.data(), x + r * features_, row_.size());  // one rounding, in bulk
      y[r] = set_->labels[static_cast<std::size_t>(src)];
    }
    stage_x_.upload(x_.span(), static_cast<std::size_t>(rows * features_));
    stage_y_.upload(y_.span(), static_cast<std::size_t>(rows));
    const Shape shape = opt_.layout == Layout::image ? Shape{rows, set_->rows, set_->cols, 1} : Shape{rows, features_};
    return {TensorView<const T>(x_.data(), shape), Span<const std::int32_t>(y_.data(), static_cast<std::size_t>(rows))};
  }

  // Where the loader stands between epochs: its order and random generator
  // (what a checkpoint keeps, so a resumed run sees the same batches).
  struct State {
    std::vector<std::int64_t> order;
    std::string rng;
  };
  State state() const {
    std::ostringstream rng;
    rng << gen_;
    return {order_, rng.str()};
  }
  void set_state(const State& s) {
    AMP_REQUIRE(s.order.size() == order_.size(), "Loader::set_state: an order of ", s.order.size(), " samples for a set of ",
                order_.size());
    std::vector<bool> seen(order_.size(), false);
    for (const auto i : s.order) {
      AMP_REQUIRE(i >= 0 && static_cast<std::size_t>(i) < seen.size() && !seen[static_cast<std::size_t>(i)],
                  "Loader::set_state: the order is not a permutation");
      seen[static_cast<std::size_t>(i)] = true;
    }
    std::istringstream rng(s.rng);
    std::mt19937_64 gen;
    AMP_REQUIRE(static_cast<bool>(rng >> gen), "Loader::set_state: unreadable random generator state");
    order_ = s.order;
    gen_ = gen;
  }

  // This rank's slice of global batch b: first sample (in the order) and count.
  std::pair<std::int64_t, std::int64_t> shard(std::int64_t b) const {
    const std::int64_t start = b * opt_.batch_size * opt_.ranks;
    const std::int64_t global = std::min(opt_.batch_size * opt_.ranks, set_->count - start);
    const std::int64_t base = global / opt_.ranks, extra = global % opt_.ranks, r = opt_.rank;
    return {start + r * base + std::min<std::int64_t>(r, extra), base + (r < extra ? 1 : 0)};
  }

 private:
  Context<B>* ctx_;
  const LabelledImages* set_;
  Options opt_;
  std::int64_t features_;
  std::vector<std::int64_t> order_;
  std::vector<float> row_;
  Staging<T, B> stage_x_;
  Staging<std::int32_t, B> stage_y_;
  Buffer<T, B> x_;
  Buffer<std::int32_t, B> y_;
  std::mt19937_64 gen_;
};

}  // namespace amp::data
