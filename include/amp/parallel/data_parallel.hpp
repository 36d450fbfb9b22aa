#pragma once
// Data parallel (Apex's DistributedDataParallel): each rank runs the model on
// its shard of every global batch, and the optimizer's gradients are summed
// over the ranks before its overflow check, so every rank sees the same sums,
// takes the same skip decision, keeps the same loss scale and stays
// bit-identical to the others.
//
//   amp::parallel::DataParallel ddp(comm, opt);  // broadcasts rank 0's parameters
//   ... the three lines as usual; opt.step() reduces, checks, steps.
//
// - Gradients are summed in their stored type (fp16/bf16 under O2, as Apex
//   DDP does; Options::reduce_in_fp32 sums an fp32 copy), in buckets of about
//   Options::bucket_bytes over the flat gradient arenas.
// - A bucket starts as soon as backward is past the last op that writes it
//   (learned from the first backward, then checked every step), so on the GPU
//   communication overlaps the rest of backward.
// - The 1/ranks average is a factor of the optimizer's gradient coefficient.
// - FP8 under delayed scaling (Transformer Engine's reduce_amax): the
//   iteration's amaxes of every operand (inputs, weights, output gradients)
//   become their maximum over the ranks, one all-reduce per model that
//   travels with the last gradient buckets, before the step sets the scales
//   from them: every rank scales alike, as one process with the global batch.
//   Options::reduce_fp8_amax = false keeps each rank's own. Current scaling
//   scales each cast by its rank's own tensor (TE reduces those only across
//   tensor-parallel groups, which amp does not have).
// - No reduction while gradients are still accumulating: the optimizer's
//   accumulation_steps does that by itself; a hand-written accumulation loop
//   wraps its earlier backward passes in no_sync() (PyTorch's name).
//
// ZeRO stage 1 (Options::zero = 1, the models built with .shard = {rank,
// ranks}): each rank keeps the fp32 masters and optimizer state of its shard
// (1/ranks of each role's elements). Each bucket goes, segment by segment, to
// the rank that keeps it (a reduce per segment, grouped: one reduce-scatter at
// the shard bounds, overlapping backward as above); each rank checks its
// shard, the ranks' statistics are combined in rank order on the device (one
// verdict, the exact global norm for clipping), each rank steps its shard, and
// every shard's new values go to every rank in their stored type (a broadcast
// per shard, grouped: an all-gather of uneven parts).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "amp/backend/collective.hpp"
#include "amp/model/parameters.hpp"
#include "amp/optim/optimizer.hpp"
#include "amp/parallel/same_model.hpp"

namespace amp::parallel {

struct DataParallelOptions {
  std::size_t bucket_bytes = std::size_t{25} << 20;  // PyTorch DDP's bucket_cap_mb = 25
  bool reduce_in_fp32 = false;                       // Apex's allreduce_always_fp32
  bool overlap = true;                               // start buckets during backward
  int zero = 0;                                      // ZeRO stage: 0 (none) or 1 (sharded masters and optimizer state)
  bool reduce_fp8_amax = true;                       // TE's reduce_amax: FP8 amaxes' maximum over the ranks
};

namespace detail {
// ZeRO-1's statistics: this rank's into its slot, then all slots combined in rank order.
struct StatsToSlotOp {
  GradStats* slot;
  const GradStats* stats;
  AMP_HOST_DEVICE void operator()(std::size_t) const { *slot = *stats; }
};
struct CombineSlotsOp {
  GradStats* stats;
  const GradStats* slots;
  int ranks;
  AMP_HOST_DEVICE void operator()(std::size_t) const {
    GradStats s = slots[0];
    for (int r = 1; r < ranks; ++r) s = amp::detail::CombineGradStats{}(s, slots[r]);
    *stats = s;
  }
};
}  // namespace detail

template <class Optimizer>
class DataParallel final : public GradientReducer, public optim::UpdateHook {
 public:
  using policy = typename Optimizer::policy;
  using backend = typename Optimizer::backend;
  using Store = typename Optimizer::Store;
  using Options = DataParallelOptions;

  DataParallel(Collective<backend>& comm, Optimizer& opt, Options options = {})
      : comm_(&comm), opt_(&opt), ctx_(&opt.context()), options_(options) {
    AMP_REQUIRE(options.bucket_bytes > 0, "DataParallel: bucket_bytes must be positive");
    AMP_REQUIRE(options.zero == 0 || options.zero == 1, "DataParallel: zero must be 0 or 1 (ZeRO stage 1), got ",
                options.zero);
    detail::check_shards(comm, opt.stores(), zero());
    detail::check_same_model(comm, opt.stores());
    if (zero()) {
      detail::check_same_values(comm, opt.context(), opt.stores());
      for (Store* s : opt.stores()) s->set_shard_collective(comm_);
      slots_ = Buffer<GradStats, backend>(*ctx_, static_cast<std::size_t>(comm_->size()), memory_kind::optimizer);
    } else {
      broadcast_parameters();
    }
    for (std::size_t s = 0; s < opt.stores().size(); ++s) {
      watches_.push_back(std::make_unique<Watch>(*this, *opt.stores()[s]));
      nn::for_each_trained_role([&](auto r) { make_buckets<decltype(r)::value>(*watches_.back()); });
    }
    for (auto& w : watches_) w->store->set_observer(w.get());
    optim::detail::Wiring::attach(opt, this, this);
  }
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;
  ~DataParallel() {
    optim::detail::Wiring::attach(*opt_, nullptr, nullptr);
    for (auto& w : watches_) w->store->set_observer(nullptr);
    if (zero())
      for (Store* s : opt_->stores()) s->set_shard_collective(nullptr);
  }

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  bool zero() const { return options_.zero == 1; }
  Collective<backend>& communicator() const { return *comm_; }

  // While it lives, backward passes only accumulate (the earlier micro-batches
  // of a hand-written accumulation loop); the step after it reduces them all.
  class NoSync {
   public:
    explicit NoSync(DataParallel& d) : d_(&d) { ++d_->no_sync_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    ~NoSync() { --d_->no_sync_; }

   private:
    DataParallel* d_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  // --- what the optimizer's gradients call ---------------------------------------------------
  // Sums every gradient over the ranks: buckets started during backward land,
  // the others start now, all in one order that every rank shares; with them
  // the FP8 amaxes' maximum (backward is done: every amax of the step is in).
  void reduce_gradients() override {
    for (auto& w : watches_)
      for (std::size_t b : w->order)
        if (!w->buckets[b].started) start(w->buckets[b]);
    if (options_.reduce_fp8_amax)
      for (Store* s : opt_->stores())
        if (const Span<float> amax = s->fp8().step_amaxes(); amax.size)
          comm_->start_all_reduce_max(*ctx_, amax.data, amax.size);
    comm_->finish(*ctx_);
    for (auto& w : watches_)
      for (auto& b : w->buckets) land(b);
    started_in_backward_ = std::exchange(early_, 0);
  }
  float gradient_factor() const override { return 1.0f / static_cast<float>(comm_->size()); }
  bool shards() const override { return zero(); }
  // ZeRO-1: the ranks' statistics of their shards, combined in rank order (every rank gets the same bits).
  void combine_stats(GradStats* stats) override {
    if (!zero()) return;
    for_each(*ctx_, 1, detail::StatsToSlotOp{slots_.data() + comm_->rank(), stats});
    comm_->all_gather(*ctx_, slots_.data(), sizeof(GradStats));
    for_each(*ctx_, 1, detail::CombineSlotsOp{stats, slots_.data(), comm_->size()});
  }
  // --- what the optimizer's update calls -------------------------------------------
  // ZeRO-1: each rank's updated shard, in the stored type, to every rank.
  void after_update() override {
    if (!zero()) return;
    for (Store* s : opt_->stores())
      nn::for_each_trained_role([&](auto r) {
        constexpr nn::role R = decltype(r)::value;
        send_shards(s->template arena<R>(), s->template shard_bounds<R>());
      });
  }

  // --- inspection ------------------------------------------------------------------
  std::size_t buckets() const {
    std::size_t n = 0;
    for (const auto& w : watches_) n += w->buckets.size();
    return n;
  }
  // Bytes each rank sends into one reduction of every gradient.
  std::size_t bytes_per_step() const {
    std::size_t n = 0;
    for (const auto& w : watches_)
      for (const auto& b : w->buckets) n += b.count * element_size(b.wire);
    return n;
  }
  // Buckets started while backward was still running, in the last reduction.
  std::size_t started_in_backward() const { return started_in_backward_; }

 private:
  struct Bucket {
    void* grads = nullptr;  // in the role's gradient arena
    std::size_t count = 0;
    element type = element::fp32;  // as stored
    element wire = element::fp32;  // as summed
    Buffer<float, backend> staging;  // reduce_in_fp32 of 16-bit gradients
    std::vector<int> params;         // table indices
    struct Segment {
      std::size_t at, count;  // elements from the bucket's start
      int owner;              // the rank whose shard it is
    };
    std::vector<Segment> segments;   // ZeRO-1: the bucket cut at shard bounds
    int ready_after = -1;            // the backward op after which it is complete (-1: before any)
    bool started = false;
  };

  // Watches one model's backward: learns which op last writes each bucket,
  // starts buckets when backward is past it, and reports a backward that
  // writes a bucket already sent.
  struct Watch final : nn::BackwardObserver {
    Watch(DataParallel& d, Store& s) : ddp(&d), store(&s), last_touch(s.table().size(), -1), bucket_of(s.table().size(), -1) {}

    void backward_begin() override {
      for (const auto& b : buckets)
        AMP_REQUIRE(!b.started, "DataParallel: a backward after this rank started sending gradients and before the "
                                "step: wrap the earlier micro-batches' backward in no_sync(), or use the optimizer's "
                                "accumulation_steps");
      op = 0, next = 0;
      launching = ddp->options_.overlap && learned && ddp->no_sync_ == 0 && optim::detail::Wiring::steps_next(*ddp->opt_);
      if (launching) launch_ready();
    }
    void gradient_touched(int param) override {
      const auto i = static_cast<std::size_t>(param);
      if (!learned) {
        last_touch[i] = op;
        return;
      }
      const int b = bucket_of[i];
      if (b >= 0 && buckets[static_cast<std::size_t>(b)].started)
        fail("DataParallel: parameter '", store->table()[i].name, "' is written by backward op ", op,
             " after its gradient bucket was sent (after op ", buckets[static_cast<std::size_t>(b)].ready_after,
             " in the first backward): backward must touch the parameters in the same order every step; "
             "construct DataParallel with overlap = false for a model whose backward changes");
    }
    void op_done() override {
      ++op;
      if (launching) {
        launch_ready();
        ddp->comm_->progress();
      }
    }
    void backward_end() override {
      if (learned) return;
      // The launch order: by the op that completes each bucket, then by bucket (the same on every rank).
      for (std::size_t k = 0; k < buckets.size(); ++k) {
        Bucket& b = buckets[k];
        for (int p : b.params) b.ready_after = std::max(b.ready_after, last_touch[static_cast<std::size_t>(p)]);
      }
      std::stable_sort(order.begin(), order.end(),
                       [&](std::size_t a, std::size_t b) { return buckets[a].ready_after < buckets[b].ready_after; });
      learned = true;
    }

    void launch_ready() {
      while (next < order.size() && buckets[order[next]].ready_after < op) {
        Bucket& b = buckets[order[next++]];
        if (!b.started) ddp->start(b), ++ddp->early_;
      }
    }

    DataParallel* ddp;
    Store* store;
    std::vector<Bucket> buckets;
    std::vector<std::size_t> order;  // launch order
    std::vector<int> last_touch;     // per parameter: the last backward op that asked for its gradient
    std::vector<int> bucket_of;      // per parameter
    int op = 0;
    std::size_t next = 0;
    bool learned = false, launching = false;
  };

  void start(Bucket& b) {
    void* data = b.grads;
    if (b.staging.data()) {
      dispatch(b.type, [&]<class G>() { convert(*ctx_, Span<const G>(static_cast<const G*>(b.grads), b.count), b.staging.span()); });
      data = b.staging.data();
    }
    if (zero()) {
      comm_->group_start();
      for (const auto& seg : b.segments)
        comm_->start_reduce_sum(*ctx_, static_cast<char*>(data) + seg.at * element_size(b.wire), seg.count, b.wire,
                                seg.owner);
      comm_->group_end();
    } else {
      comm_->start_all_reduce_sum(*ctx_, data, b.count, b.wire);
    }
    b.started = true;
  }
  void land(Bucket& b) {
    if (b.started && b.staging.data())
      dispatch(b.type, [&]<class G>() { convert(*ctx_, Span<const float>(b.staging.span()), Span<G>(static_cast<G*>(b.grads), b.count)); });
    b.started = false;
  }
  template <class F>
  static void dispatch(element t, F&& f) {
    if (t == element::fp16) f.template operator()<half>();
    else if (t == element::bf16) f.template operator()<bfloat16>();
    else f.template operator()<float>();
  }

  // Buckets over one role's gradient arena: parameters from the last declared
  // (the first that backward completes) back, cut at about bucket_bytes.
  template <nn::role R>
  void make_buckets(Watch& w) {
    auto& group = w.store->template arena<R>();
    using G = typename std::remove_reference_t<decltype(group)>::grad_type;
    if (group.count() == 0) return;
    const auto& table = w.store->table();
    std::size_t end = group.count();  // the bucket being filled ends here (padding included)
    Bucket b;
    auto close = [&](std::size_t begin) {
      b.grads = group.grads().data + begin;
      b.count = end - begin;
      b.type = element_of<G>();
      b.wire = options_.reduce_in_fp32 ? element::fp32 : b.type;
      if (options_.reduce_in_fp32 && b.type != element::fp32)
        b.staging = Buffer<float, backend>(*ctx_, b.count, memory_kind::grads);
      for (int p : b.params) w.bucket_of[static_cast<std::size_t>(p)] = static_cast<int>(w.buckets.size());
      const auto& bounds = w.store->template shard_bounds<R>();
      for (std::size_t r = 0; r + 1 < bounds.size(); ++r) {
        const std::size_t lo = std::max(begin, bounds[r]), hi = std::min(end, bounds[r + 1]);
        if (lo < hi) b.segments.push_back({lo - begin, hi - lo, static_cast<int>(r)});
      }
      w.order.push_back(w.buckets.size());
      w.buckets.push_back(std::move(b));
      b = Bucket{};
      end = begin;
    };
    for (std::size_t i = table.size(); i-- > 0;) {
      if (table[i].kind != R) continue;
      b.params.push_back(static_cast<int>(i));
      if ((end - table[i].offset) * sizeof(G) >= options_.bucket_bytes) close(table[i].offset);
    }
    if (!b.params.empty()) close(0);
  }

  template <class Arena>
  void send_shards(Arena& a, const std::vector<std::size_t>& bounds) {
    using S = typename Arena::stored_type;
    if (a.count() == 0) return;  // an empty role sends nothing
    comm_->group_start();
    for (std::size_t r = 0; r + 1 < bounds.size(); ++r)
      if (bounds[r + 1] > bounds[r])
        comm_->broadcast(*ctx_, a.values().data + bounds[r], (bounds[r + 1] - bounds[r]) * sizeof(S), static_cast<int>(r));
    comm_->group_end();
  }

  // Rank 0's values, masters, buffers and FP8 scaling state to every rank, bit for bit.
  void broadcast_parameters() {
    auto send = [&](auto span) {
      if (span.size) comm_->broadcast(*ctx_, span.data, span.size * sizeof(*span.data), 0);
    };
    for (Store* s : opt_->stores()) {
      nn::for_each_trained_role([&](auto r) {
        auto& a = s->template arena<decltype(r)::value>();
        send(a.values()), send(a.master());
      });
      send(s->buffer_values());
      send(s->fp8().history_values()), send(s->fp8().scale_values()), send(s->fp8().position());
      s->fp8().refresh_inverses();
      s->mark_updated();
    }
  }

  Collective<backend>* comm_;
  Optimizer* opt_;
  Context<backend>* ctx_;
  Options options_;
  std::vector<std::unique_ptr<Watch>> watches_;
  int no_sync_ = 0;
  std::size_t early_ = 0, started_in_backward_ = 0;
  Buffer<GradStats, backend> slots_;  // ZeRO-1: one per rank
};

}  // namespace amp::parallel
