#pragma once
// cuDNN's graph (backend) API, the pieces amp plans with: descriptors owned by
// RAII, attributes set by type, and plan(): an operation graph, the engine
// configurations cuDNN's heuristics rank, and the first of them that finalises
// among those whose numerical notes the caller accepts. A plan runs with its
// tensors bound by unique id (a variant pack) and a workspace of its size.
// Planning happens once per shape, off the training loop's clock; running
// allocates nothing and never waits for the stream.
#include <cudnn.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>
#include <vector>

#include "amp/backend/cuda/context.cuh"
#include "amp/backend/cuda/error.cuh"
#include "amp/core/numeric.hpp"

#define AMP_CUDNN_CHECK(call)                                                                              \
  do {                                                                                                     \
    const cudnnStatus_t amp_status_ = (call);                                                              \
    if (amp_status_ != CUDNN_STATUS_SUCCESS) {                                                             \
      char amp_detail_[512] = "";                                                                          \
      cudnnGetLastErrorString(amp_detail_, sizeof amp_detail_);                                            \
      ::amp::fail("cuDNN error in ", #call, " (" __FILE__ ":" AMP_STRINGIFY(__LINE__) "): ",               \
                  cudnnGetErrorString(amp_status_), amp_detail_[0] ? ": " : "", amp_detail_);              \
    }                                                                                                      \
  } while (0)

namespace amp::detail::cudnn {

// cuDNN's handle for one context, on its stream (Context::library_state<Handle>()).
class Handle {
 public:
  explicit Handle(Context<cuda>& ctx) {
    check_cudnn_version();
    ctx.activate();
    AMP_CUDNN_CHECK(cudnnCreate(&h_));
    AMP_CUDNN_CHECK(cudnnSetStream(h_, ctx.stream()));
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { cudnnDestroy(h_); }
  cudnnHandle_t get() const { return h_; }

 private:
  cudnnHandle_t h_ = nullptr;
};

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  Descriptor() = default;
  explicit Descriptor(cudnnBackendDescriptorType_t type) { AMP_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor(Descriptor&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Descriptor& operator=(Descriptor&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  ~Descriptor() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  cudnnBackendDescriptor_t get() const { return d_; }
  explicit operator bool() const { return d_ != nullptr; }

  template <class V>
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const V* values,
                  std::int64_t count = 1) {
    AMP_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
    return *this;
  }
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t d) {
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &d);
  }
  Descriptor& finalize() {
    AMP_CUDNN_CHECK(cudnnBackendFinalize(d_));
    return *this;
  }
  cudnnStatus_t try_finalize() { return cudnnBackendFinalize(d_); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

template <class T>
constexpr cudnnDataType_t data_type() {
  if constexpr (std::is_same_v<T, float>) return CUDNN_DATA_FLOAT;
  else if constexpr (std::is_same_v<T, half>) return CUDNN_DATA_HALF;
  else return CUDNN_DATA_BFLOAT16;
}

// A 4-d tensor: its unique id, type, dims and strides; virtual ones stay inside a fused graph.
inline Descriptor tensor(std::int64_t uid, cudnnDataType_t type, std::initializer_list<std::int64_t> dims,
                         std::initializer_list<std::int64_t> strides, bool is_virtual = false) {
  const std::int64_t alignment = 16;  // every address bound is checked against it (Plan::run)
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid)
      .set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.begin(), static_cast<std::int64_t>(dims.size()))
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.begin(), static_cast<std::int64_t>(strides.size()))
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment)
      .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual)
      .finalize();
  return t;
}

// Which engines a plan may use, by their numerical notes.
struct Notes {
  bool tensor_cores = true;  // false: fp32 stays fp32 (no TF32, no inputs converted down)
  // Always refused: nondeterministic engines (atomics) and reduced-precision sums.
  bool allows(const std::vector<cudnnBackendNumericalNote_t>& notes) const {
    for (const auto n : notes) {
      if (n == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC || n == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) return false;
      if (!tensor_cores && (n == CUDNN_NUMERICAL_NOTE_TENSOR_CORE || n == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS))
        return false;
    }
    return true;
  }
};

inline std::vector<cudnnBackendNumericalNote_t> numerical_notes(const Descriptor& config) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  std::int64_t got = 0;
  AMP_CUDNN_CHECK(cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                           &got, &raw));
  std::vector<cudnnBackendNumericalNote_t> notes(CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
  AMP_CUDNN_CHECK(cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                           static_cast<std::int64_t>(notes.size()), &got, notes.data()));
  notes.resize(static_cast<std::size_t>(got));
  return notes;
}

// An execution plan, the descriptors it was made from, and the workspace it
// needs; empty when no allowed engine runs its graph.
class Plan {
 public:
  explicit operator bool() const { return static_cast<bool>(plan_); }
  std::size_t workspace_bytes() const { return workspace_; }

  // Runs on the handle's stream: uids[i] bound to pointers[i]. The variant
  // pack (the binding) of the last run is reused while the addresses are the
  // same, as a training loop's are (its memory is planned): no descriptor
  // work per step.
  void run(cudnnHandle_t handle, std::initializer_list<std::int64_t> uids, std::initializer_list<void*> pointers,
           void* workspace) {
    const bool same = pack_ && bound_.size() == pointers.size() + 1 &&
                      std::equal(pointers.begin(), pointers.end(), bound_.begin()) && bound_.back() == workspace;
    if (!same) {
      for (void* p : pointers)
        AMP_REQUIRE(reinterpret_cast<std::uintptr_t>(p) % 16 == 0, "cuDNN: a tensor at ", p,
                    " is not 16-byte aligned (graph memory is 256-byte aligned; a view into it at an odd offset is not)");
      Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
      pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.begin(), static_cast<std::int64_t>(uids.size()))
          .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers.begin(),
               static_cast<std::int64_t>(pointers.size()))
          .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace)
          .finalize();
      pack_ = std::move(pack);
      bound_.assign(pointers.begin(), pointers.end());
      bound_.push_back(workspace);
      ++packs_built_;
    }
    AMP_CUDNN_CHECK(cudnnBackendExecute(handle, plan_.get(), pack_.get()));
  }
  // Variant packs built so far: one per distinct binding, not one per run.
  std::size_t packs_built() const { return packs_built_; }

 private:
  friend class Graph;
  std::vector<Descriptor> parts_;
  Descriptor plan_;
  std::size_t workspace_ = 0;
  Descriptor pack_;
  std::vector<void*> bound_;  // the pack's pointers, then its workspace
  std::size_t packs_built_ = 0;
};

// The operations of one graph and every descriptor they refer to.
class Graph {
 public:
  // Keeps d alive as long as the plan; its handle is what attributes refer to.
  cudnnBackendDescriptor_t keep(Descriptor d) {
    parts_.push_back(std::move(d));
    return parts_.back().get();
  }
  // An operation; one this cuDNN refuses (a type it has no kernel for) leaves the plan empty.
  void add(Descriptor op) {
    refused_ = refused_ || op.try_finalize() != CUDNN_STATUS_SUCCESS;
    ops_.push_back(keep(std::move(op)));
  }

  // The first engine configuration that cuDNN's heuristics rank (mode A, then
  // its fallback list) whose notes `notes` allows and that finalises on this
  // GPU, or an empty plan.
  Plan plan(cudnnHandle_t handle, Notes notes) && {
    if (refused_) return {};
    Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops_.data(), static_cast<std::int64_t>(ops_.size()))
        .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle);
    if (graph.try_finalize() != CUDNN_STATUS_SUCCESS) return {};
    for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      Plan p = first_allowed(handle, graph, mode, notes);
      if (!p) continue;
      parts_.push_back(std::move(graph));
      for (auto& d : parts_) p.parts_.push_back(std::move(d));
      return p;
    }
    return {};
  }

 private:
  static Plan first_allowed(cudnnHandle_t handle, const Descriptor& graph, cudnnBackendHeurMode_t mode, Notes notes) {
    Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph.get())
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
    if (heuristics.try_finalize() != CUDNN_STATUS_SUCCESS) return {};
    std::int64_t count = 0;
    AMP_CUDNN_CHECK(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    std::vector<Descriptor> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (std::int64_t i = 0; i < count; ++i) raw.push_back(configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR).get());
    AMP_CUDNN_CHECK(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count, raw.data()));
    for (std::int64_t i = 0; i < count; ++i) {
      Descriptor& config = configs[static_cast<std::size_t>(i)];
      if (!notes.allows(numerical_notes(config))) continue;
      Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle)
          .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config.get());
      if (plan.try_finalize() != CUDNN_STATUS_SUCCESS) continue;  // this engine cannot run it here
      std::int64_t bytes = 0, got = 0;
      AMP_CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                               &got, &bytes));
      Plan p;
      p.plan_ = std::move(plan);
      p.workspace_ = static_cast<std::size_t>(bytes);
      p.parts_.push_back(std::move(config));
      return p;
    }
    return {};
  }

  std::vector<Descriptor> parts_;  // tensors, descriptors and operations, kept by the plan
  std::vector<cudnnBackendDescriptor_t> ops_;
  bool refused_ = false;
};

}  // namespace amp::detail::cudnn
