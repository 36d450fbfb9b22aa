#pragma once
// The fused causal attention contract. Per head (heads = batch x heads of
// them), rows of Q, K, V [time, dim] lie contiguous, in the GEMM type G:
//   forward   O = dropout(softmax(alpha Q K^T, causal)) V, and each query
//             row's log-sum-exp of its scaled scores (fp32), kept for backward;
//   backward  dQ, dK, dV (overwritten) from dO, O and the log-sum-exps: the
//             probabilities are recomputed block by block, never stored, so
//             memory is O(time) per head, not O(time^2).
// Dropout's keep decisions come from the caller's Dropout functor:
//   p, keep_scale (1 / (1 - p)); key() read once per launch, when it runs;
//   keep(key, row, j) for query row (head x time + t) and key position j.
// On the CPU the caller's materialised path draws the same bits, so both paths
// drop the same probabilities; a library kernel (cuDNN's, on the GPU) draws its
// own from key(), the same in its forward and backward. Softmax statistics and
// every sum are fp32.
#include <cstdint>
#include <type_traits>

namespace amp {

struct AttentionShape {
  std::int64_t heads, time, dim;
  float alpha;  // the scores' scale, 1 / sqrt(dim) for GPT-2
};

// Whether backend B has the fused kernels (attention_available,
// attention_forward, attention_backward), for head dimensions up to max_dim and
// the GEMM and output types G, O with runs<G, O>; its attention header says so.
template <class B>
struct fused_attention : std::false_type {};

}  // namespace amp
