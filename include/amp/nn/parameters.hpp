#pragma once
// The parameters of a whole model: one flat arena per role (weights, fp32
// master copy, gradients, and O1's low-precision cast cache). Blocks are padded
// to a common element multiple, so index i means the same parameter in every
// role and the optimizer and the overflow check are single flat passes.
#include <cstdint>
#include <type_traits>

#include "amp/backend/algorithm.hpp"
#include "amp/backend/arena.hpp"
#include "amp/nn/init.hpp"
#include "amp/policy.hpp"

namespace amp::nn {

// A block of parameters: element offset and count in every role's arena.
struct ParamSlot {
  std::size_t offset = 0;
  std::size_t count = 0;
};

// Collects the blocks while layers are built, before anything is allocated.
class ParameterPlan {
 public:
  // 128 elements: 256 bytes for 16-bit types, so every role's blocks align alike.
  static constexpr std::size_t block_multiple = 128;

  ParamSlot add(std::size_t count) {
    const ParamSlot slot{total_, count};
    total_ += (count + block_multiple - 1) / block_multiple * block_multiple;
    return slot;
  }
  std::size_t total() const { return total_; }

 private:
  std::size_t total_ = 0;
};

template <Policy P, Backend B>
class Parameters {
 public:
  using param_type = typename P::param_type;
  using grad_type = typename P::grad_type;
  using gemm_type = typename P::template compute_type<op::gemm>;
  static constexpr bool has_master = uses_master_weights_v<P>;
  static constexpr bool has_cast_cache = casts_weights_v<P>;
  static_assert(!has_master || std::is_same_v<typename P::master_type, float>, "master weights are fp32");

  Parameters(Context<B>& ctx, const ParameterPlan& plan) : ctx_(&ctx), count_(plan.total()) {
    weights_ = make_arena<param_type>(memory_kind::weights);
    grads_ = make_arena<grad_type>(memory_kind::grads);
    if constexpr (has_master) master_ = make_arena<float>(memory_kind::master);
    if constexpr (has_cast_cache) cast_cache_ = make_arena<gemm_type>(memory_kind::weights);
    fill(ctx, weights(), cast<param_type>(0.0f));
    if constexpr (has_master) fill(ctx, master(), 0.0f);
    fill(ctx, grads(), cast<grad_type>(0.0f));
  }
  Parameters(const Parameters&) = delete;
  Parameters& operator=(const Parameters&) = delete;

  Context<B>& context() const { return *ctx_; }
  // Elements per role, padding included (padding stays zero in every role).
  std::size_t count() const { return count_; }

  Span<param_type> weights() const { return weights_.view(whole<param_type>()); }
  Span<grad_type> grads() const { return grads_.view(whole<grad_type>()); }
  Span<float> master() const {
    if constexpr (has_master) return master_.view(whole<float>());
    else return {};
  }

  Span<param_type> weights(ParamSlot s) const { return weights().subspan(s.offset, s.count); }
  Span<grad_type> grads(ParamSlot s) const { return grads().subspan(s.offset, s.count); }

  // The weights as the GEMM consumes them. O1 keeps a cast copy that is
  // refreshed once per optimizer step (autocast's cache), not once per use.
  Span<const gemm_type> gemm_weights(ParamSlot s) {
    if constexpr (has_cast_cache) {
      const Span<gemm_type> cache = cast_cache_.view(whole<gemm_type>());
      if (cache_version_ != version_) {
        convert(*ctx_, Span<const param_type>(weights()), cache);
        cache_version_ = version_;
        ++cache_refreshes_;
      }
      return cache.subspan(s.offset, s.count);
    } else {
      return weights(s);
    }
  }

  // Uniform init of one block from (seed, block offset): the same values on every backend.
  void init_uniform(ParamSlot s, std::uint64_t seed, float bound) {
    float* m = nullptr;
    if constexpr (has_master) m = master().data + s.offset;
    for_each(*ctx_, s.count, detail::UniformInitOp<param_type>{weights().data + s.offset, m, seed + s.offset, bound});
    mark_updated();
  }

  // The optimizer (or a load) changed the weights: stale cast cache.
  void mark_updated() { ++version_; }
  std::uint64_t version() const { return version_; }
  // How often O1's cast cache was rebuilt: once per step however many forwards.
  std::uint64_t cast_cache_refreshes() const { return cache_refreshes_; }

 private:
  template <class T>
  Slot<T> whole() const {
    return {0, count_};
  }
  template <class T>
  Arena<B> make_arena(memory_kind kind) {
    ArenaLayout layout;
    layout.add<T>(count_);
    return Arena<B>(*ctx_, layout, kind);
  }

  Context<B>* ctx_;
  std::size_t count_;
  Arena<B> weights_, grads_, master_, cast_cache_;
  std::uint64_t version_ = 1;
  std::uint64_t cache_version_ = 0;
  std::uint64_t cache_refreshes_ = 0;
};

}  // namespace amp::nn
