#pragma once
// The convolution contract both backends share. Images are channels-last
// [N, H, W, C], padding symmetric as PyTorch's (an output size rounds down).
// Filters are stored in PyTorch's [K, C, kh, kw]; the passes read them
// channels-last, [K, kh, kw, C] (ToTapMajorOp: the im2col columns' order, and
// what cuDNN's NHWC kernels read), which the layer makes once per forward and
// keeps on its tape for backward. Where a backend has the field's library for
// a type (oneDNN on the CPU for fp32 and bf16, cuDNN on the GPU for fp32, fp16
// and bf16), the three passes are that library's, with fp32 accumulation and
// one rounding into the output:
//   forward          y  = conv(x, w) + bias                  (w channels-last)
//   backward_data    dx = the transposed convolution of dy    (w channels-last; dx fp32 or T)
//   backward_weights dw = x (*) dy and dbias = sum of dy, in fp32 [K, C, kh, kw]
// Each pass overwrites its outputs; the layer adds gradients where it must.
// The im2col + GEMM path in nn/conv.hpp is the reference and the rest.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "amp/core/macros.hpp"
#include "amp/core/numeric.hpp"

namespace amp {

struct ConvGeometry {
  std::int64_t n, h, w, c;     // input
  std::int64_t k, kh, kw;      // filters
  std::int64_t stride, pad, dilation;
  std::int64_t ho, wo;         // output

  AMP_HOST_DEVICE std::int64_t pixels() const { return n * ho * wo; }
  AMP_HOST_DEVICE std::int64_t window() const { return c * kh * kw; }
  // The padding past the last input pixel that the last output reads (PyTorch
  // pads symmetrically and drops what no whole window covers).
  std::int64_t pad_end_h() const { return (ho - 1) * stride + dilation * (kh - 1) + 1 - h - pad; }
  std::int64_t pad_end_w() const { return (wo - 1) * stride + dilation * (kw - 1) + 1 - w - pad; }
};

namespace detail {
// Weight element i in PyTorch's order [K, C, kh, kw] <-> its place in tap-major [K, kh, kw, C].
struct TapMajorIndex {
  std::int64_t channels, taps;
  AMP_HOST_DEVICE std::int64_t operator()(std::size_t i) const {
    const auto at = static_cast<std::int64_t>(i);
    const std::int64_t window = channels * taps, k = at / window, c = at % window / taps, tap = at % taps;
    return k * window + tap * channels + c;
  }
};
template <class G>
struct ToTapMajorOp {
  const G* weight;
  G* out;
  TapMajorIndex index;
  AMP_HOST_DEVICE void operator()(std::size_t i) const { out[index(i)] = weight[i]; }
};
// The fp32 filter gradient in PyTorch's order from a tap-major one in S.
template <class S>
struct FromTapMajorOp {
  const S* tap_major;
  float* out;
  TapMajorIndex index;
  AMP_HOST_DEVICE void operator()(std::size_t i) const { out[i] = cast<float>(tap_major[index(i)]); }
};
}  // namespace detail

// Whether backend B has the library passes (conv_available, conv_forward,
// conv_backward_data, conv_backward_weights); its conv header says so.
template <class B>
struct library_conv : std::false_type {};

}  // namespace amp
