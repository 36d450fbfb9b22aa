#pragma once
// The fused causal attention contract. Per head (heads = batch x heads of
// them), rows of Q, K, V [time, dim] in the GEMM type G:
//   forward   O = dropout(softmax(alpha Q K^T, causal)) V, and each query
//             row's log-sum-exp of its scaled scores (fp32), kept for backward;
//   backward  dQ, dK, dV (overwritten) from dO, O and the log-sum-exps: the
//             probabilities are recomputed block by block, never stored, so
//             memory is O(time) per head, not O(time^2).
// The rows lie where AttentionShape says: each head contiguous by default, or
// strided views into a layer's own buffers (GPT's packed [batch, time, 3,
// heads, dim] qkv and merged [batch, time, heads, dim] output), so a layer
// hands its tensors over in place instead of copying heads out and back.
// Dropout's keep decisions come from the caller's Dropout functor:
//   p, keep_scale (1 / (1 - p)); key() read once per launch, when it runs;
//   keep(key, row, j) for query row (head x time + t) and key position j.
// On the CPU the caller's materialised path draws the same bits, so both paths
// drop the same probabilities; a library kernel (cuDNN's, on the GPU) draws its
// own from key(), the same in its forward and backward. Softmax statistics and
// every sum are fp32; the log-sum-exps are [heads x time], contiguous.
#include <cstdint>
#include <type_traits>

namespace amp {

struct AttentionShape {
  std::int64_t heads, time, dim;
  float alpha;  // the scores' scale, 1 / sqrt(dim) for GPT-2
  // The layout: heads come `group` to a batch item, head n being head n % group
  // of item n / group; a row lies `in_stride` values after the previous one in
  // Q, K, V, dQ, dK, dV, and `out_stride` after it in O and dO (0: dim, each
  // head's rows contiguous). GPT's qkv: group = heads, in_stride = 3 x heads x
  // dim, K and V at offsets heads x dim and 2 x heads x dim.
  std::int64_t group = 1, in_stride = 0, out_stride = 0;

  std::int64_t in_rows() const { return in_stride ? in_stride : dim; }
  std::int64_t out_rows() const { return out_stride ? out_stride : dim; }
  // Where row 0 of head n starts, at a row stride of `rows`; row t is t x rows further.
  std::int64_t head_start(std::int64_t n, std::int64_t rows) const {
    return n / group * time * rows + n % group * dim;
  }
};

// Whether backend B has the fused kernels (attention_available,
// attention_forward, attention_backward), for head dimensions up to max_dim and
// the GEMM and output types G, O with runs<G, O>; its attention header says so.
template <class B>
struct fused_attention : std::false_type {};

}  // namespace amp
