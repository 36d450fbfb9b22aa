#pragma once
// oneDNN's GEMMs (libdnnl, what PyTorch's CPU path uses), bound by symbol name.
// amp calls a handful of oneDNN's C functions; declaring them here under amp's
// own names (asm labels) instead of including <dnnl.h> keeps every oneDNN C
// name out of the user's global namespace. Their C ABI is stable since 1.0.
// oneDNN picks its kernels at run time: AVX2, AVX-512, AVX512-BF16 or AMX.
// The primitive API (convolution) is oneDNN 2.x's: its descriptors are plain
// structs, held here as opaque storage of at least their size, and every
// constant below is checked against <dnnl.h> by tests/host/test_onednn_abi.cpp.
#include <cstddef>
#include <cstdint>
#include <string>

namespace amp::detail::onednn {

// dnnl_status_t, a C enum: 0 is dnnl_success.
using status = int;

// Row-major C = alpha op(A) op(B) + beta C in fp32 (dnnl.h).
status sgemm(char transa, char transb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
             std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc)
    __asm__("dnnl_sgemm");

// The same with bf16 A and B and fp32 accumulation and C; exported by libdnnl
// for its tests and for Intel's framework extensions (not in dnnl.h).
status gemm_bf16bf16f32(char transa, char transb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                        const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b, std::int64_t ldb,
                        float beta, float* c, std::int64_t ldc) __asm__("dnnl_gemm_bf16bf16f32");

struct version_t {
  int major, minor, patch;
  const char* hash;
  unsigned cpu_runtime, gpu_runtime;
};
const version_t* version() __asm__("dnnl_version");
int effective_cpu_isa() __asm__("dnnl_get_effective_cpu_isa");

// The primitive API: handles are pointers to oneDNN's objects.
using engine = struct engine_impl*;
using stream = struct stream_impl*;
using memory = struct memory_impl*;
using primitive = struct primitive_impl*;
using primitive_desc = struct primitive_desc_impl*;
using primitive_attr = struct primitive_attr_impl*;
using dims = std::int64_t[12];  // dnnl_dims_t: DNNL_MAX_NDIMS entries
struct alignas(8) memory_desc {  // dnnl_memory_desc_t (696 bytes in 2.x)
  unsigned char bytes[1024];
};
struct alignas(8) op_desc {  // dnnl_convolution_desc_t (5976 bytes in 2.x)
  unsigned char bytes[8192];
};
struct exec_arg {
  int arg;
  memory mem;
};

// Values of oneDNN's C enums and macros that amp uses.
namespace value {
inline constexpr int unimplemented = 3;  // dnnl_unimplemented
inline constexpr int cpu = 1;          // dnnl_cpu
inline constexpr unsigned in_order = 1;  // dnnl_stream_default_flags
inline constexpr int f32 = 3, bf16 = 2;  // dnnl_data_type_t
inline constexpr int any = 1, nhwc = 20, ohwi = 20, oihw = 5, x = 2;  // dnnl_format_tag_t (nhwc, ohwi: acdb)
inline constexpr int forward_training = 64, backward_data = 160, backward_weights = 192;  // dnnl_prop_kind_t
inline constexpr int convolution_direct = 1;  // dnnl_alg_kind_t
inline constexpr int scratchpad_user = 1;     // dnnl_scratchpad_mode_t
inline constexpr int query_scratchpad_md = 136, query_exec_arg_md = 255, query_impl_info_str = 8;  // dnnl_query_t
inline constexpr int arg_src = 1, arg_dst = 17, arg_weights = 33, arg_bias = 41, arg_scratchpad = 80,
                     arg_diff_src = 129, arg_diff_dst = 145, arg_diff_weights = 161, arg_diff_bias = 169;
}  // namespace value

status engine_create(engine* e, int kind, std::size_t index) __asm__("dnnl_engine_create");
status engine_destroy(engine e) __asm__("dnnl_engine_destroy");
status stream_create(stream* s, engine e, unsigned flags) __asm__("dnnl_stream_create");
status stream_destroy(stream s) __asm__("dnnl_stream_destroy");
status memory_desc_init_by_tag(memory_desc* md, int ndims, const dims d, int data_type, int tag)
    __asm__("dnnl_memory_desc_init_by_tag");
int memory_desc_equal(const memory_desc* a, const memory_desc* b) __asm__("dnnl_memory_desc_equal");
std::size_t memory_desc_get_size(const memory_desc* md) __asm__("dnnl_memory_desc_get_size");
status convolution_forward_desc_init(op_desc* d, int prop_kind, int alg, const memory_desc* src,
                                     const memory_desc* weights, const memory_desc* bias, const memory_desc* dst,
                                     const dims strides, const dims dilates, const dims pad_l, const dims pad_r)
    __asm__("dnnl_dilated_convolution_forward_desc_init");
status convolution_backward_data_desc_init(op_desc* d, int alg, const memory_desc* diff_src, const memory_desc* weights,
                                           const memory_desc* diff_dst, const dims strides, const dims dilates,
                                           const dims pad_l, const dims pad_r)
    __asm__("dnnl_dilated_convolution_backward_data_desc_init");
status convolution_backward_weights_desc_init(op_desc* d, int alg, const memory_desc* src,
                                              const memory_desc* diff_weights, const memory_desc* diff_bias,
                                              const memory_desc* diff_dst, const dims strides, const dims dilates,
                                              const dims pad_l, const dims pad_r)
    __asm__("dnnl_dilated_convolution_backward_weights_desc_init");
status primitive_attr_create(primitive_attr* a) __asm__("dnnl_primitive_attr_create");
status primitive_attr_destroy(primitive_attr a) __asm__("dnnl_primitive_attr_destroy");
status primitive_attr_set_scratchpad_mode(primitive_attr a, int mode) __asm__("dnnl_primitive_attr_set_scratchpad_mode");
status primitive_desc_create(primitive_desc* pd, const void* op, primitive_attr a, engine e, primitive_desc hint)
    __asm__("dnnl_primitive_desc_create");
status reorder_primitive_desc_create(primitive_desc* pd, const memory_desc* src, engine src_engine,
                                     const memory_desc* dst, engine dst_engine, primitive_attr a)
    __asm__("dnnl_reorder_primitive_desc_create");
status primitive_desc_destroy(primitive_desc pd) __asm__("dnnl_primitive_desc_destroy");
const memory_desc* primitive_desc_query_md(primitive_desc pd, int what, int index) __asm__("dnnl_primitive_desc_query_md");
status primitive_desc_query(primitive_desc pd, int what, int index, void* result) __asm__("dnnl_primitive_desc_query");
status primitive_create(primitive* p, primitive_desc pd) __asm__("dnnl_primitive_create");
status primitive_destroy(primitive p) __asm__("dnnl_primitive_destroy");
status primitive_execute(primitive p, stream s, int nargs, const exec_arg* args) __asm__("dnnl_primitive_execute");
status memory_create(memory* m, const memory_desc* md, engine e, void* handle) __asm__("dnnl_memory_create");
status memory_set_data_handle(memory m, void* handle) __asm__("dnnl_memory_set_data_handle");
status memory_destroy(memory m) __asm__("dnnl_memory_destroy");

inline std::string version_string() {
  const version_t* v = version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

// The instruction set oneDNN's kernels use on this CPU (dnnl_cpu_isa_t values).
inline const char* isa_name() {
  switch (effective_cpu_isa()) {
    case 0x1: return "SSE4.1";
    case 0x3: return "AVX";
    case 0x7: return "AVX2";
    case 0x407: return "AVX2-VNNI";
    case 0x27: return "AVX-512";
    case 0x67: return "AVX512-VNNI";
    case 0xe7: return "AVX512-BF16";
    case 0x3e7: return "AMX";
    default: return "other";
  }
}

}  // namespace amp::detail::onednn
