#pragma once
// The flat arenas of one parameter role: values, gradients, an fp32 master
// copy exactly when the stored type differs from master_type (fp32 weights
// are their own), and (O1) cast caches of the values in the type a GEMM or a
// convolution consumes. The role picks the stored type from the policy.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "amp/backend/algorithm.hpp"
#include "amp/backend/buffer.hpp"
#include "amp/policy.hpp"

namespace amp::nn {

// What a parameter is for; the role picks its stored type from the policy.
// fp32: the weights of a layer kept in fp32 (amp::KeepFp32) in a model that
// stores weights narrower: fp32 values and gradients, their own master (none
// apart, also under O3), no cast caches. Buffers are model state that is not
// trained (BatchNorm's running statistics): fp32, no gradient, saved and
// exported with the parameters. The trained roles come first.
enum class role { weight, norm, fp32, buffer };
inline constexpr std::size_t trained_roles = 3;

inline constexpr const char* role_name(role r) {
  return r == role::weight ? "weight" : r == role::norm ? "norm" : r == role::fp32 ? "fp32" : "buffer";
}

// f(std::integral_constant<role, R>{}) for each trained role R, in order.
template <class F>
constexpr void for_each_trained_role(F&& f) {
  f(std::integral_constant<role, role::weight>{});
  f(std::integral_constant<role, role::norm>{});
  f(std::integral_constant<role, role::fp32>{});
}

// The role of the weights of a layer of policy Q: its model's weight role when
// Q stores and differentiates them alike, else fp32.
template <Policy Q>
inline constexpr role weight_role_v =
    std::is_same_v<typename Q::param_type, typename model_policy_t<Q>::param_type> &&
            std::is_same_v<typename Q::grad_type, typename model_policy_t<Q>::grad_type>
        ? role::weight
        : role::fp32;
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
struct role_types<P, role::fp32> {
  using stored = float;
  using grad = float;
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
  static constexpr bool has_master = R != role::fp32 && keeps_master_v<P, stored_type>;
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

}  // namespace amp::nn
