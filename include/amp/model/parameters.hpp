#pragma once
// The parameters of a model: their table, and per role (model/arena.hpp) the
// flat arenas of values, gradients, masters and cast caches. Blocks are padded
// to a common multiple, so offset i is the same parameter in every arena of
// its role, and the overflow check and the optimizer step are flat passes.
//
// ZeRO-1 (a Shard of several ranks): this process keeps the fp32 masters of
// its shard [shard_begin, shard_end) of each role only, an even 1/ranks cut
// at 128-element blocks (or whole tensors); values and gradients stay whole
// (every rank runs the whole model).
#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "amp/backend/algorithm.hpp"
#include "amp/backend/buffer.hpp"
#include "amp/backend/collective.hpp"
#include "amp/model/arena.hpp"
#include "amp/model/fp8_state.hpp"
#include "amp/model/init.hpp"
#include "amp/model/numerics.hpp"
#include "amp/model/shard.hpp"
#include "amp/policy.hpp"
#include "amp/tensor.hpp"

namespace amp::nn {

// Watches backward passes (data parallel starts reducing a bucket of gradients
// as soon as backward is past the last op that writes it): which parameter
// gradients each backward op asks for, and where each op ends.
class BackwardObserver {
 public:
  virtual void backward_begin() = 0;
  virtual void gradient_touched(int param_index) = 0;
  virtual void op_done() = 0;
  virtual void backward_end() = 0;

 protected:
  ~BackwardObserver() = default;
};

// What has written a store's gradients so far: backward passes and hands
// (grads(p) given out to write), and of the backward passes those whose loss
// carried no scale. An optimizer's gradients compare them with what they saw
// at their last step, so a step knows its gradients are new.
struct GradientWrites {
  std::uint64_t writes = 0;
  std::uint64_t unscaled_backwards = 0;
};

// A layer's handle on one parameter of role R: where it lives in its role's arenas.
template <role R>
struct Param {
  std::size_t offset = 0;  // elements from the start of the role's arenas
  std::size_t count = 0;
  Shape shape;
  int index = -1;  // in the store's table
};

// One row of the store's table: what a checkpoint or an exporter needs to know.
struct ParamInfo {
  std::string name;
  Shape shape;
  role kind = role::weight;
  bool decay = true;  // weight decay applies (not to biases and norm parameters)
  Init init;
  std::size_t offset = 0;
  std::size_t count = 0;
};

template <Policy P, Backend B>
class ParameterStore {
 public:
  // 128 elements: 256 bytes for 16-bit types, so every arena's blocks align alike.
  static constexpr std::size_t block_multiple = 128;

  explicit ParameterStore(Context<B>& ctx) : ctx_(&ctx) {}
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;

  // Declares a parameter; only before allocate(). Names are unique.
  template <role R>
  Param<R> declare(std::string name, Shape shape, Init init, bool decay = true) {
    AMP_REQUIRE(!allocated_, "parameter '", name, "' declared after the model was built");
    AMP_REQUIRE(shape.numel() > 0, "parameter '", name, "' has no elements: shape ", shape.str());
    for (const auto& p : table_) AMP_REQUIRE(p.name != name, "two parameters are named '", name, "'");
    std::size_t& total = counts_[index(R)];
    const auto count = static_cast<std::size_t>(shape.numel());
    const Param<R> p{total, count, shape, static_cast<int>(table_.size())};
    table_.push_back({std::move(name), shape, R, decay, init, total, count});
    total += (count + block_multiple - 1) / block_multiple * block_multiple;
    return p;
  }

  // The arenas, once every parameter is declared; values start at zero.
  // With a shard of several ranks, masters only for this rank's shard.
  void allocate(Shard shard = {}) {
    AMP_REQUIRE(!allocated_, "ParameterStore::allocate: already allocated");
    AMP_REQUIRE(shard.ranks >= 1 && shard.rank >= 0 && shard.rank < shard.ranks, "ParameterStore: shard ", shard.rank,
                " of ", shard.ranks, " ranks does not exist");
    shard_ = shard;
    const auto r = static_cast<std::size_t>(shard.rank);
    for_each_trained_role([&](auto k) {
      constexpr role R = decltype(k)::value;
      std::vector<std::size_t>& bounds = bounds_[index(R)];
      bounds = partition(R, counts_[index(R)], shard.ranks);
      arena<R>().allocate(*ctx_, counts_[index(R)], bounds[r], bounds[r + 1]);
    });
    buffers_ = Buffer<float, B>(*ctx_, counts_[index(role::buffer)], memory_kind::weights);
    fill(*ctx_, buffers_.span(), 0.0f);
    fp8_.allocate(*ctx_);
    allocated_ = true;
  }
  bool allocated() const { return allocated_; }

  // Every parameter from its Init, computed on the host from (seed, parameter,
  // element): the same values on every backend and thread count.
  void initialize(std::uint64_t seed) {
    for (std::size_t i = 0; i < table_.size(); ++i) {
      const ParamInfo& p = table_[i];
      std::vector<float> v(p.count);
      const std::uint64_t param_seed = mix64(seed ^ mix64(i + 1));
      for (std::size_t k = 0; k < p.count; ++k) v[k] = detail::init_value(p.init, param_seed, k);
      set_values(static_cast<int>(i), v);
    }
  }

  // Parameter `index` from fp32 values: the master copy (if any) takes them
  // as they are, the stored values rounded once.
  void set_values(int index, const std::vector<float>& v) {
    const ParamInfo& p = table_.at(static_cast<std::size_t>(index));
    AMP_REQUIRE(v.size() == p.count, "parameter '", p.name, "' has ", p.count, " elements, got ", v.size());
    if (p.kind == role::buffer) upload(*ctx_, buffers_.span().subspan(p.offset, p.count), v);
    else with_arena(p.kind, [&](auto& a) { upload_values(a, p, v); });
    mark_updated();
  }

  // Parameter `index` as fp32: the master copy where this process keeps one
  // (with ZeRO-1: in its shard), else the stored values.
  std::vector<float> get_values(int index) const {
    const ParamInfo& p = table_.at(static_cast<std::size_t>(index));
    if (p.kind != role::buffer) return with_arena(p.kind, [&](const auto& a) { return download_values(a, p); });
    return download(*ctx_, Span<const float>(buffers_.span().subspan(p.offset, p.count)));
  }

  const std::vector<ParamInfo>& table() const { return table_; }
  Context<B>& context() const { return *ctx_; }

  // --- ZeRO-1 -------------------------------------------------------------------------
  const Shard& shard() const { return shard_; }
  bool sharded() const { return shard_.ranks > 1; }
  // Rank r's shard of role R: [shard_bounds<R>()[r], shard_bounds<R>()[r + 1]).
  template <role R>
  const std::vector<std::size_t>& shard_bounds() const {
    return bounds_[index(R)];
  }
  // The elements of parameter p in rank r's shard (all of them unsharded; every rank keeps buffers whole).
  Part part(const ParamInfo& p, int r) const {
    if (p.kind == role::buffer) return {0, p.count};
    return part_in_shard(p.offset, p.count, bounds_[index(p.kind)], r);
  }
  Part part(const ParamInfo& p) const { return part(p, shard_.rank); }
  // This rank holds all of p (its masters, state, summed gradient).
  bool owns(const ParamInfo& p) const { return part(p).size() == p.count; }
  // Where p's element 0 falls in a buffer over this rank's shard of its role
  // (masters, optimizer state): only elements of part(p) are there (unsigned
  // arithmetic: add part(p).begin before indexing).
  std::size_t shard_offset(const ParamInfo& p) const {
    return p.offset - with_arena(p.kind, [](const auto& a) { return a.shard_begin(); });
  }
  // The ranks' communicator while data parallel shards this store (checkpoints gather through it).
  Collective<B>* shard_collective() const { return shard_collective_; }
  void set_shard_collective(Collective<B>* c) { shard_collective_ = c; }
  // Parameter p's values in an fp32 buffer over this rank's shard of its role
  // (the masters, an optimizer moment), on rank 0; under ZeRO-1 sent by the
  // ranks that keep them. Collective when sharded (every rank calls it); empty
  // on the other ranks.
  std::vector<float> shard_part_on_root(Span<float> shard, const ParamInfo& p) const {
    if (!sharded()) return download(*ctx_, Span<const float>(shard.subspan(shard_offset(p), p.count)));
    AMP_REQUIRE(shard_collective_, "parameter '", p.name, "': the model is sharded (ZeRO-1): gather it (a checkpoint, "
                                   "an export) while its DataParallel (zero = 1) lives, on every rank");
    Buffer<float, B> staging(*ctx_, p.count, memory_kind::workspace);  // the other ranks' parts
    for (int r = 0; r < shard_.ranks; ++r) {
      const Part q = part(p, r);
      if (!q.size()) continue;
      float* at = r == shard_.rank ? shard.data + (shard_offset(p) + q.begin) : staging.data() + q.begin;
      shard_collective_->broadcast(*ctx_, at, q.size() * sizeof(float), r);
      if (r == shard_.rank && r == 0) ctx_->copy(staging.data() + q.begin, at, q.size() * sizeof(float));
    }
    if (shard_.rank != 0) return {};
    return download(*ctx_, Span<const float>(staging.data(), p.count));
  }
  // get_values(index) on rank 0 with every master there: under ZeRO-1 from the
  // rank that keeps it (collective, empty elsewhere); else get_values itself.
  std::vector<float> values_on_root(int index) const {
    const ParamInfo& p = table_.at(static_cast<std::size_t>(index));
    if (!sharded() || p.kind == role::buffer) return get_values(index);
    return with_arena(p.kind, [&](const auto& a) {
      if constexpr (std::remove_cvref_t<decltype(a)>::has_master) return shard_part_on_root(a.master(), p);
      else return get_values(index);
    });
  }

  template <role R>
  RoleArena<P, B, R>& arena() {
    return std::get<index(R)>(arenas_);
  }
  template <role R>
  const RoleArena<P, B, R>& arena() const {
    return std::get<index(R)>(arenas_);
  }
  // f(arena) on the arena of trained role r, chosen at run time.
  template <class F>
  decltype(auto) with_arena(role r, F&& f) {
    return with_arena_of(*this, r, f);
  }
  template <class F>
  decltype(auto) with_arena(role r, F&& f) const {
    return with_arena_of(*this, r, f);
  }

  template <role R>
  auto values(Param<R> p) const {
    if constexpr (R == role::buffer) return buffers_.span().subspan(p.offset, p.count);
    else return arena<R>().values().subspan(p.offset, p.count);
  }
  // A parameter's gradient. Handed out writable, it counts as written (the
  // next step may use it); read through a const store, it does not.
  template <role R>
  auto grads(Param<R> p) {
    ++writes_.writes;
    return arena<R>().grads().subspan(p.offset, p.count);
  }
  template <role R>
  auto grads(Param<R> p) const {
    using G = typename RoleArena<P, B, R>::grad_type;
    return Span<const G>(arena<R>().grads().subspan(p.offset, p.count));
  }
  // A parameter's gradient for a backward op to add to: the backward observer
  // (data parallel) learns that this op writes it.
  template <role R>
  auto backward_grads(Param<R> p) {
    if (observer_) observer_->gradient_touched(p.index);
    return arena<R>().grads().subspan(p.offset, p.count);
  }
  // A backward pass ran over this model (`scaled`: its loss carried a scale, or its seeds came by hand).
  void note_backward(bool scaled) {
    ctx_->each_run_on_host([this, scaled] {
      ++writes_.writes;
      if (!scaled) ++writes_.unscaled_backwards;
    });
  }
  GradientWrites gradient_writes() const { return writes_; }
  // Every buffer (BatchNorm's running statistics), fp32.
  Span<float> buffer_values() const { return buffers_.span(); }

  BackwardObserver* observer() const { return observer_; }
  void set_observer(BackwardObserver* o) { observer_ = o; }
  // The values as T: the stored values or the role's cast cache.
  template <class T, role R>
  Span<const T> as(Param<R> p) {
    return arena<R>().template as<T>(*ctx_).subspan(p.offset, p.count);
  }

  void zero_grad() {
    for_each_trained_role([&](auto k) {
      auto& a = arena<decltype(k)::value>();
      fill(*ctx_, a.grads(), cast<typename std::remove_reference_t<decltype(a)>::grad_type>(0.0f));
    });
  }
  // The values changed (an optimizer step, a load): cast caches are stale.
  void mark_updated() {
    for_each_trained_role([&](auto k) { arena<decltype(k)::value>().mark_updated(); });
    fp8_.mark_updated();
  }
  // The model's work after an optimizer step updated it: FP8 scales from
  // this iteration's amaxes (delayed scaling, on the device), and the cast
  // caches stale (host bookkeeping: again after each replay of a captured step).
  void after_step() {
    fp8_.step();
    numerics_.end_step();
    ctx_->each_run_on_host([this] { mark_updated(); });
  }
  // FP8 scaling state and weight codes (policies with an fp8 alias; empty otherwise).
  Fp8State<P, B>& fp8() { return fp8_; }
  const Fp8State<P, B>& fp8() const { return fp8_; }
  // The numerics report (ModelOptions::numerics_every).
  Numerics<B>& numerics() { return numerics_; }
  const Numerics<B>& numerics() const { return numerics_; }
  // A layer with weights runs (its weight's index): the order that picks which layers stay out of FP8.
  void visit_layer(int weight_index) {
    if constexpr (uses_fp8_v<P>) fp8_.visit(weight_index);
  }
  std::uint64_t cast_cache_refreshes() const { return arena<role::weight>().cache_refreshes(); }
  // Trained elements, padding included.
  std::size_t count() const {
    std::size_t n = 0;
    for_each_trained_role([&](auto k) { n += arena<decltype(k)::value>().count(); });
    return n;
  }

 private:
  template <class Group>
  void upload_values(Group& g, const ParamInfo& p, const std::vector<float>& v) {
    using S = typename Group::stored_type;
    std::vector<S> stored(v.size());
    for (std::size_t k = 0; k < v.size(); ++k) stored[k] = cast<S>(v[k]);
    upload(*ctx_, g.values().subspan(p.offset, p.count), stored);
    if constexpr (Group::has_master) {
      const Part q = part(p);
      if (q.size())
        upload(*ctx_, g.master().subspan(shard_offset(p) + q.begin, q.size()), v.data() + q.begin, q.size());
    }
  }
  template <class Group>
  std::vector<float> download_values(const Group& g, const ParamInfo& p) const {
    using S = typename Group::stored_type;
    if constexpr (Group::has_master)
      if (owns(p)) return download(*ctx_, Span<const float>(g.master().subspan(shard_offset(p), p.count)));
    const auto stored = download(*ctx_, Span<const S>(g.values().subspan(p.offset, p.count)));
    std::vector<float> out(stored.size());
    for (std::size_t k = 0; k < stored.size(); ++k) out[k] = cast<float>(stored[k]);
    if constexpr (Group::has_master) {  // ZeRO-1: the masters of this rank's part
      const Part q = part(p);
      if (q.size()) {
        const auto m = download(*ctx_, Span<const float>(g.master().subspan(shard_offset(p) + q.begin, q.size())));
        std::copy(m.begin(), m.end(), out.begin() + static_cast<std::ptrdiff_t>(q.begin));
      }
    }
    return out;
  }

  static constexpr std::size_t index(role r) { return static_cast<std::size_t>(r); }
  template <class Self, class F>
  static decltype(auto) with_arena_of(Self& self, role r, F& f) {
    AMP_REQUIRE(r != role::buffer, "ParameterStore: a buffer has no role arena");
    if (r == role::weight) return f(self.template arena<role::weight>());
    if (r == role::norm) return f(self.template arena<role::norm>());
    return f(self.template arena<role::fp32>());
  }

  std::vector<std::size_t> partition(role R, std::size_t count, int ranks) const {
    std::vector<std::size_t> starts;
    for (const auto& p : table_)
      if (p.kind == R) starts.push_back(p.offset);
    return nn::shard_bounds(starts, count, ranks, shard_.whole_tensors, block_multiple);
  }

  Context<B>* ctx_;
  std::vector<ParamInfo> table_;
  std::size_t counts_[trained_roles + 1] = {};  // elements per role, buffers last
  bool allocated_ = false;
  BackwardObserver* observer_ = nullptr;
  GradientWrites writes_;
  Shard shard_;
  std::vector<std::size_t> bounds_[trained_roles];  // each trained role's shard bounds
  Collective<B>* shard_collective_ = nullptr;
  std::tuple<RoleArena<P, B, role::weight>, RoleArena<P, B, role::norm>, RoleArena<P, B, role::fp32>> arenas_;
  Buffer<float, B> buffers_;
  Fp8State<P, B> fp8_;
  Numerics<B> numerics_;
};

}  // namespace amp::nn
