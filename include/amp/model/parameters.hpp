#pragma once
// The parameters of a model. Each parameter has a role, and the role picks its
// stored type from the policy: weights and biases are stored as param_type,
// norm scale/shift as norm_param_type, each role in its own flat arenas:
// values, gradients, an fp32 master copy exactly when the stored type differs
// from master_type, and (O1) a cast cache of the values in the type a GEMM or a
// convolution consumes. Blocks are padded to a common multiple, so offset i is
// the same parameter in every arena of its role, and the overflow check and the
// optimizer step are flat passes.
//
// ZeRO-1 (a Shard of several ranks): this process keeps the fp32 masters of
// its shard [shard_begin, shard_end) of each role only, an even 1/ranks cut
// at 128-element blocks (or whole tensors); values and gradients stay whole
// (every rank runs the whole model).
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "amp/backend/algorithm.hpp"
#include "amp/backend/buffer.hpp"
#include "amp/backend/collective.hpp"
#include "amp/model/fp8_state.hpp"
#include "amp/model/init.hpp"
#include "amp/model/shard.hpp"
#include "amp/policy.hpp"
#include "amp/tensor.hpp"

namespace amp::nn {

// What a parameter is for; the role picks its stored type from the policy.
// Buffers are model state that is not trained (BatchNorm's running statistics):
// fp32, no gradient, saved and exported with the parameters.
enum class role { weight, norm, buffer };

inline constexpr const char* role_name(role r) {
  return r == role::weight ? "weight" : r == role::norm ? "norm" : "buffer";
}

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

template <Policy P, role R>
struct role_types;
template <Policy P>
struct role_types<P, role::weight> {
  using stored = typename P::param_type;
  using grad = typename P::grad_type;
};
template <Policy P>
struct role_types<P, role::norm> {
  using stored = typename P::norm_param_type;
  using grad = typename P::norm_param_type;
};
template <Policy P>
struct role_types<P, role::buffer> {
  using stored = float;
  using grad = void;
};

// The arenas of one role: values, gradients, master copy, cast caches.
template <Policy P, Backend B, role R>
class RoleArena {
 public:
  using stored_type = typename role_types<P, R>::stored;
  using grad_type = typename role_types<P, R>::grad;
  using gemm_type = typename P::template compute_type<op::gemm>;
  using conv_type = typename P::template compute_type<op::conv>;
  static constexpr bool has_master = keeps_master_v<P, stored_type>;
  static_assert(!has_master || std::is_same_v<typename P::master_type, float>, "master copies are fp32");
  // Caches of the values as GEMMs and convolutions consume them (weights only: norms read their values).
  static constexpr bool caches_gemm = R == role::weight && !std::is_same_v<stored_type, gemm_type>;
  static constexpr bool caches_conv =
      R == role::weight && !std::is_same_v<stored_type, conv_type> && !std::is_same_v<gemm_type, conv_type>;

  void allocate(Context<B>& ctx, std::size_t count, std::size_t shard_begin, std::size_t shard_end) {
    count_ = count, shard_begin_ = shard_begin, shard_end_ = shard_end;
    values_ = Buffer<stored_type, B>(ctx, count, memory_kind::weights);
    grads_ = Buffer<grad_type, B>(ctx, count, memory_kind::grads);
    fill(ctx, values_.span(), cast<stored_type>(0.0f));
    fill(ctx, grads_.span(), cast<grad_type>(0.0f));
    if constexpr (has_master) {
      master_ = Buffer<float, B>(ctx, shard_end - shard_begin, memory_kind::master);
      fill(ctx, master_.span(), 0.0f);
    }
    if constexpr (caches_gemm) gemm_cache_ = Buffer<gemm_type, B>(ctx, count, memory_kind::weights);
    if constexpr (caches_conv) conv_cache_ = Buffer<conv_type, B>(ctx, count, memory_kind::weights);
  }

  // Elements in each arena, padding included (padding stays zero everywhere).
  std::size_t count() const { return count_; }
  // The elements this process updates: all, or its ZeRO-1 shard.
  std::size_t shard_begin() const { return shard_begin_; }
  std::size_t shard_end() const { return shard_end_; }
  std::size_t shard_count() const { return shard_end_ - shard_begin_; }
  Span<stored_type> values() const { return values_.span(); }
  Span<grad_type> grads() const { return grads_.span(); }
  // The fp32 masters of the shard: element k is element shard_begin() + k of the role.
  Span<float> master() const {
    if constexpr (has_master) return master_.span();
    else return {};
  }

  // The values as T (the stored type, or a cast cache refreshed once per
  // optimizer step however often it is used: autocast's weight cache).
  template <class T>
  Span<const T> as(Context<B>& ctx) {
    if constexpr (std::is_same_v<T, stored_type>) {
      return values_.span();
    } else if constexpr (caches_gemm && std::is_same_v<T, gemm_type>) {
      return refreshed(ctx, gemm_cache_, gemm_version_);
    } else {
      static_assert(caches_conv && std::is_same_v<T, conv_type>, "no cast cache of this type for this role");
      return refreshed(ctx, conv_cache_, conv_version_);
    }
  }

  void mark_updated() { ++version_; }
  std::uint64_t cache_refreshes() const { return refreshes_; }

 private:
  template <class T>
  Span<const T> refreshed(Context<B>& ctx, Buffer<T, B>& cache, std::uint64_t& seen) {
    if (seen != version_) {
      convert(ctx, Span<const stored_type>(values_.span()), cache.span());
      seen = version_;
      ++refreshes_;
    }
    return cache.span();
  }

  std::size_t count_ = 0, shard_begin_ = 0, shard_end_ = 0;
  Buffer<stored_type, B> values_;
  Buffer<grad_type, B> grads_;
  Buffer<float, B> master_;
  Buffer<gemm_type, B> gemm_cache_;
  Buffer<conv_type, B> conv_cache_;
  std::uint64_t version_ = 1, gemm_version_ = 0, conv_version_ = 0, refreshes_ = 0;
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
    std::size_t& total = R == role::weight ? weight_count_ : R == role::norm ? norm_count_ : buffer_count_;
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
    weight_bounds_ = partition(role::weight, weight_count_, shard.ranks);
    norm_bounds_ = partition(role::norm, norm_count_, shard.ranks);
    const auto r = static_cast<std::size_t>(shard.rank);
    weights_.allocate(*ctx_, weight_count_, weight_bounds_[r], weight_bounds_[r + 1]);
    norms_.allocate(*ctx_, norm_count_, norm_bounds_[r], norm_bounds_[r + 1]);
    buffers_ = Buffer<float, B>(*ctx_, buffer_count_, memory_kind::weights);
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
      const std::uint64_t param_seed = detail::mix64(seed ^ detail::mix64(i + 1));
      for (std::size_t k = 0; k < p.count; ++k) v[k] = detail::init_value(p.init, param_seed, k);
      set_values(static_cast<int>(i), v);
    }
  }

  // Parameter `index` from fp32 values: the master copy (if any) takes them
  // as they are, the stored values rounded once.
  void set_values(int index, const std::vector<float>& v) {
    const ParamInfo& p = table_.at(static_cast<std::size_t>(index));
    AMP_REQUIRE(v.size() == p.count, "parameter '", p.name, "' has ", p.count, " elements, got ", v.size());
    if (p.kind == role::weight) upload_values(weights_, p, v);
    else if (p.kind == role::norm) upload_values(norms_, p, v);
    else upload(*ctx_, buffers_.span().subspan(p.offset, p.count), v);
    mark_updated();
  }

  // Parameter `index` as fp32: the master copy where this process keeps one
  // (with ZeRO-1: in its shard), else the stored values.
  std::vector<float> get_values(int index) const {
    const ParamInfo& p = table_.at(static_cast<std::size_t>(index));
    if (p.kind == role::weight) return download_values(weights_, p);
    if (p.kind == role::norm) return download_values(norms_, p);
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
    return R == role::weight ? weight_bounds_ : norm_bounds_;
  }
  // The elements of parameter p in rank r's shard (all of them unsharded; every rank keeps buffers whole).
  Part part(const ParamInfo& p, int r) const {
    if (p.kind == role::buffer) return {0, p.count};
    return part_in_shard(p.offset, p.count, p.kind == role::weight ? weight_bounds_ : norm_bounds_, r);
  }
  Part part(const ParamInfo& p) const { return part(p, shard_.rank); }
  // This rank holds all of p (its masters, state, summed gradient).
  bool owns(const ParamInfo& p) const { return part(p).size() == p.count; }
  // Where p's element 0 falls in a buffer over this rank's shard of its role
  // (masters, optimizer state): only elements of part(p) are there (unsigned
  // arithmetic: add part(p).begin before indexing).
  std::size_t shard_offset(const ParamInfo& p) const {
    return p.offset - (p.kind == role::weight ? weights_.shard_begin() : norms_.shard_begin());
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
    if (sharded() && p.kind == role::weight && RoleArena<P, B, role::weight>::has_master)
      return shard_part_on_root(weights_.master(), p);
    if (sharded() && p.kind == role::norm && RoleArena<P, B, role::norm>::has_master)
      return shard_part_on_root(norms_.master(), p);
    return get_values(index);
  }

  template <role R>
  RoleArena<P, B, R>& arena() {
    if constexpr (R == role::weight) return weights_;
    else return norms_;
  }
  template <role R>
  const RoleArena<P, B, R>& arena() const {
    if constexpr (R == role::weight) return weights_;
    else return norms_;
  }

  template <role R>
  auto values(Param<R> p) const {
    if constexpr (R == role::buffer) return buffers_.span().subspan(p.offset, p.count);
    else return arena<R>().values().subspan(p.offset, p.count);
  }
  // A parameter's gradient.
  template <role R>
  auto grads(Param<R> p) const {
    return arena<R>().grads().subspan(p.offset, p.count);
  }
  // A parameter's gradient for a backward op to add to: the backward observer
  // (data parallel) learns that this op writes it.
  template <role R>
  auto backward_grads(Param<R> p) {
    if (observer_) observer_->gradient_touched(p.index);
    return grads(p);
  }
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
    fill(*ctx_, weights_.grads(), cast<typename RoleArena<P, B, role::weight>::grad_type>(0.0f));
    fill(*ctx_, norms_.grads(), cast<typename RoleArena<P, B, role::norm>::grad_type>(0.0f));
  }
  // The values changed (an optimizer step, a load): cast caches are stale.
  void mark_updated() {
    weights_.mark_updated();
    norms_.mark_updated();
    fp8_.mark_updated();
  }
  // FP8 scaling state and weight codes (policies with an fp8 alias; empty otherwise).
  Fp8State<P, B>& fp8() { return fp8_; }
  const Fp8State<P, B>& fp8() const { return fp8_; }
  // A layer with weights runs (its weight's index): the order that picks which layers stay out of FP8.
  void visit_layer(int weight_index) {
    if constexpr (uses_fp8_v<P>) fp8_.visit(weight_index);
  }
  std::uint64_t cast_cache_refreshes() const { return weights_.cache_refreshes(); }
  // Trained elements, padding included.
  std::size_t count() const { return weights_.count() + norms_.count(); }

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

  std::vector<std::size_t> partition(role R, std::size_t count, int ranks) const {
    std::vector<std::size_t> starts;
    for (const auto& p : table_)
      if (p.kind == R) starts.push_back(p.offset);
    return nn::shard_bounds(starts, count, ranks, shard_.whole_tensors, block_multiple);
  }

  Context<B>* ctx_;
  std::vector<ParamInfo> table_;
  std::size_t weight_count_ = 0, norm_count_ = 0, buffer_count_ = 0;
  bool allocated_ = false;
  BackwardObserver* observer_ = nullptr;
  Shard shard_;
  std::vector<std::size_t> weight_bounds_, norm_bounds_;
  Collective<B>* shard_collective_ = nullptr;
  RoleArena<P, B, role::weight> weights_;
  RoleArena<P, B, role::norm> norms_;
  Buffer<float, B> buffers_;
  Fp8State<P, B> fp8_;
};

}  // namespace amp::nn
