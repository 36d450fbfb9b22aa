#pragma once
// Checkpoints: everything a resume needs, in one archive (archive.hpp), written
// atomically (a temporary file, fsync, rename: a writer killed half way leaves
// the previous checkpoint as it was).
//
//   amp.meta            text: format, amp version, policy, optimizer, scaling mode, parameter table
//   param.<name>        stored values, in the stored type
//   master.<name>       fp32 master copy, where the policy keeps one
//   buffer.<name>       fp32 buffers (BatchNorm's running statistics)
//   optim.<k>.<name>    fp32 optimizer state k (momentum; Adam's moments)
//   optim.step          int64 [applied steps, steps as the schedule counts them]
//   optim.pows          fp32 [beta1^t, beta2^t]
//   scaler.scale        fp32 [scale]
//   scaler.counters     int64 [growth tracker, hysteresis left, consecutive skips, steps, skipped]
//   model.forwards      int64 [forwards run]: with the seed, the dropout masks' stream
//   fp8.history         fp32 [operands x history] FP8 amax histories (FP8 policies)
//   fp8.amax, fp8.scale fp32 [operands]; fp8.position int64 [1]: the history's next slot
//   extra.<key>         whatever the caller adds (a data loader's order, epoch logs)
//
// load() reads and checks the whole file, and that it fits the model (names,
// shapes, optimizer), before it changes anything. Into the same policy it
// restores every bit; into another, each parameter's fp32 value (the master
// where there was one) is set and rounded once: O0 -> O2 gives masters equal to
// the fp32 values and fp16 copies of them, O2 -> O0 takes the masters.
//
// ZeRO-1 (a model built with a shard, under DataParallel with zero = 1): every
// rank calls save(); the masters and optimizer state are gathered, tensor by
// tensor, to rank 0, which writes the one-process format. Every rank calls
// load() on the same file and takes its shard. So a sharded run resumes on the
// same rank count, and its checkpoint loads into one process (and back).
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "amp/core/traits.hpp"
#include "amp/io/archive.hpp"
#include "amp/io/file.hpp"
#include "amp/model/model.hpp"
#include "amp/scaling/loss_scaler.hpp"
#include "amp/version.hpp"

namespace amp::io {

namespace detail {
template <class T>
constexpr dtype dtype_of() {
  if constexpr (std::is_same_v<T, float>) return dtype::fp32;
  else if constexpr (std::is_same_v<T, half>) return dtype::fp16;
  else return dtype::bf16;
}

inline std::string shape_text(const Shape& s) { return s.str(); }

template <Policy P, Backend B>
std::string parameter_table(const nn::ParameterStore<P, B>& store) {
  std::ostringstream t;
  for (const auto& p : store.table()) t << p.name << " " << p.shape.str() << " " << nn::role_name(p.kind) << "\n";
  return t.str();
}

// The layers with FP8 state, in slot order ("0,2,4"; empty without FP8).
template <Policy P, Backend B>
std::string fp8_layer_names(const nn::ParameterStore<P, B>& store) {
  std::string names;
  for (const auto& l : store.fp8().layers()) names += (names.empty() ? "" : ",") + l.name;
  return names;
}

// One role's values of one parameter, with its master copy: raw bytes from backend memory.
template <class Group, class Store>
void put_group_tensor(Archive& a, const Store& store, const Group& g, const nn::ParamInfo& p) {
  using S = typename Group::stored_type;
  std::vector<std::uint64_t> shape;
  for (int i = 0; i < p.shape.rank(); ++i) shape.push_back(static_cast<std::uint64_t>(p.shape[i]));
  if (store.shard().rank == 0) {
    const auto values = download(store.context(), Span<const S>(g.values().subspan(p.offset, p.count)));
    a.put("param." + p.name, dtype_of<S>(), shape, values.data(), values.size());
  }
  if constexpr (Group::has_master) {
    const auto master = store.shard_part_on_root(g.master(), p);
    if (store.shard().rank == 0) a.put("master." + p.name, dtype::fp32, shape, master.data(), master.size());
  }
}

inline std::vector<std::uint64_t> dims_of(const Shape& s) {
  std::vector<std::uint64_t> d;
  for (int i = 0; i < s.rank(); ++i) d.push_back(static_cast<std::uint64_t>(s[i]));
  return d;
}

// The fp32 values a record holds (fp16/bf16 widened exactly).
inline std::vector<float> as_fp32(const Record& r) {
  std::vector<float> out(static_cast<std::size_t>(r.numel()));
  if (r.type == dtype::fp32) {
    std::memcpy(out.data(), r.payload.data(), r.payload.size());
  } else {
    const auto raw = r.values<std::uint16_t>();
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = r.type == dtype::fp16 ? cast<float>(amp::detail::half_from_bits(raw[i]))
                                     : cast<float>(amp::detail::bfloat16_from_bits(raw[i]));
  }
  return out;
}

// Which of the optimizer's stores is this model's (an optimizer may train several models).
template <class Optimizer, class Store>
std::size_t store_index(const Optimizer& opt, const Store& store) {
  const auto& stores = opt.stores();
  const auto it = std::find(stores.begin(), stores.end(), &store);
  AMP_REQUIRE(it != stores.end(), "checkpoint: the optimizer does not train this model's parameters");
  return static_cast<std::size_t>(it - stores.begin());
}

// The optimizer's state buffer k of trained role r of store `slot`.
template <class Optimizer>
Span<float> state_of(const Optimizer& opt, nn::role r, int k, std::size_t slot) {
  Span<float> s;
  nn::for_each_trained_role([&](auto role) {
    if (decltype(role)::value == r) s = opt.template state_buffer<decltype(role)::value>(k, slot);
  });
  return s;
}

}  // namespace detail

// Writes model, optimizer (with its scaler) and the caller's extras to `path`,
// atomically. Under ZeRO-1 every rank calls it and rank 0 writes.
template <class Model, class Optimizer>
void save(const std::string& path, Model& model, Optimizer& opt, const Archive& extra = {}) {
  using P = typename Model::policy;
  auto& store = model.parameters();
  const std::size_t slot = detail::store_index(opt, store);
  const bool writer = store.shard().rank == 0;
  AMP_REQUIRE(!store.sharded() || store.shard_collective(), "checkpoint: the model is sharded (ZeRO-1): save it while "
              "its DataParallel (zero = 1) lives, on every rank");
  Archive a;
  std::ostringstream meta;
  meta << "format=" << Archive::version << "\namp_version=" << AMP_VERSION_STRING << "\npolicy=" << policy_name<P>()
       << "\noptimizer=" << Optimizer::rule_name << "\nscaling=" << static_cast<int>(P::loss_scaling)
       << "\nfp8_layers=" << detail::fp8_layer_names(store) << "\nparameters=\n"
       << detail::parameter_table(store);
  a.put_text("amp.meta", meta.str());
  for (const auto& p : store.table()) {
    if (p.kind != nn::role::buffer) {
      store.with_arena(p.kind, [&](const auto& g) { detail::put_group_tensor(a, store, g, p); });
    } else {
      const auto v = store.get_values(static_cast<int>(&p - store.table().data()));
      a.put("buffer." + p.name, dtype::fp32, detail::dims_of(p.shape), v.data(), v.size());
    }
  }
  for (int k = 0; k < Optimizer::state_buffers; ++k)
    for (const auto& p : store.table()) {
      if (p.kind == nn::role::buffer) continue;
      const auto v = store.shard_part_on_root(detail::state_of(opt, p.kind, k, slot), p);
      if (writer)
        a.put("optim." + std::to_string(k) + "." + p.name, dtype::fp32, detail::dims_of(p.shape), v.data(), v.size());
    }
  const auto st = opt.state();
  a.put_int64("optim.step", std::vector<std::int64_t>{st.t, opt.steps()});
  const float pows[2] = {st.beta1_pow, st.beta2_pow};
  a.put("optim.pows", dtype::fp32, {2}, pows, 2);
  const ScalerState sc = opt.scaler().state();
  a.put("scaler.scale", dtype::fp32, {1}, &sc.scale, 1);
  a.put_int64("scaler.counters", std::vector<std::int64_t>{sc.growth_tracker, sc.hysteresis_left, sc.consecutive_skips, sc.steps, sc.skipped});
  a.put_int64("model.forwards", std::vector<std::int64_t>{static_cast<std::int64_t>(model.graph().forward_count())});
  if (auto& fp8 = store.fp8(); fp8.operands() > 0) {
    const auto put = [&](const char* name, Span<float> s, std::vector<std::uint64_t> dims) {
      const auto v = download(store.context(), Span<const float>(s));
      a.put(name, dtype::fp32, dims, v.data(), v.size());
    };
    const auto n = static_cast<std::uint64_t>(fp8.operands());
    put("fp8.history", fp8.history_values(), {n, fp8.history_values().size / n});
    put("fp8.amax", fp8.amax_values(), {n});
    put("fp8.scale", fp8.scale_values(), {n});
    const auto position = download(store.context(), Span<const std::int32_t>(fp8.position()));
    a.put_int64("fp8.position", std::vector<std::int64_t>{position[0]});
  }
  for (const auto& [name, r] : extra.records()) a.put("extra." + name, r.type, r.shape, r.payload.data(), r.payload.size());
  if (!store.sharded()) return write_file(path, a.serialize());
  // ZeRO-1: rank 0 writes; every rank returns once the file is there (or with rank 0's error).
  std::string failure;
  if (writer) try {
      write_file(path, a.serialize());
    } catch (const Error& e) {
      failure = e.what();
    }
  const auto written = store.shard_collective()->all_gather(failure.empty() ? 1 : 0);
  AMP_REQUIRE(written[0] == 1, "checkpoint: rank 0 could not write '", path, "'", failure.empty() ? "" : ": " + failure);
}

// Restores what save() wrote; returns the extras. Nothing changes unless the
// whole file is sound and fits the model and optimizer. Under ZeRO-1 every
// rank loads the file and keeps its shard of the masters and state.
template <class Model, class Optimizer>
Archive load(const std::string& path, Model& model, Optimizer& opt) {
  using P = typename Model::policy;
  auto& store = model.parameters();
  auto& ctx = store.context();
  const std::size_t slot = detail::store_index(opt, store);
  const Archive a = Archive::read(path);
  const Record* meta = a.find("amp.meta");
  AMP_REQUIRE(meta, "checkpoint '", path, "' has no amp.meta record");
  const std::string m = meta->text();
  const std::string policy = detail::meta_value(m, "policy"), optimizer = detail::meta_value(m, "optimizer");
  const bool same_policy = policy == policy_name<P>();
  AMP_REQUIRE(optimizer == Optimizer::rule_name, "checkpoint '", path, "' holds ", optimizer.empty() ? "no" : optimizer,
              " optimizer state; this optimizer is ", Optimizer::rule_name);

  // Every tensor the model and optimizer need, with its shape; and no other.
  std::vector<std::string> expected;
  auto need = [&](const std::string& name, const Shape& shape) {
    const Record* r = a.find(name);
    AMP_REQUIRE(r, "checkpoint '", path, "' has no tensor '", name, "' (the model has it, ", shape.str(), ")");
    AMP_REQUIRE(r->shape == detail::dims_of(shape) && (r->type == dtype::fp32 || r->type == dtype::fp16 || r->type == dtype::bf16), "checkpoint '",
                path, "': tensor '", name, "' is ", dtype_name(r->type), " of ", r->shape.size(),
                " dimensions that do not match the model's ", shape.str());
    expected.push_back(name);
    return r;
  };
  for (const auto& p : store.table()) {
    if (p.kind == nn::role::buffer) {
      need("buffer." + p.name, p.shape);
      continue;
    }
    need("param." + p.name, p.shape);
    if (a.find("master." + p.name)) need("master." + p.name, p.shape);
    for (int k = 0; k < Optimizer::state_buffers; ++k) need("optim." + std::to_string(k) + "." + p.name, p.shape);
  }
  for (const char* name : {"optim.step", "optim.pows", "scaler.scale", "scaler.counters", "model.forwards", "amp.meta"}) {
    AMP_REQUIRE(a.find(name), "checkpoint '", path, "' has no '", name, "' record");
    expected.push_back(name);
  }
  // FP8 scaling state: restored into the same policy, else (a conversion) left to start afresh.
  auto& fp8 = store.fp8();
  // (and the same FP8 layers: a layer moved out of FP8, NoFp8, would shift every slot; older checkpoints name none)
  const std::string fp8_layers = detail::meta_value(m, "fp8_layers");
  const bool fp8_state = same_policy && fp8.operands() > 0 && a.find("fp8.scale") &&
                         (fp8_layers.empty() || fp8_layers == detail::fp8_layer_names(store));
  for (const char* name : {"fp8.history", "fp8.amax", "fp8.scale", "fp8.position"})
    if (a.find(name)) expected.push_back(name);
  if (fp8_state) {
    const auto n = static_cast<std::int64_t>(fp8.operands());
    need("fp8.history", Shape{n, static_cast<std::int64_t>(fp8.history_values().size) / n});
    need("fp8.amax", Shape{n});
    need("fp8.scale", Shape{n});
    const Record* record = a.find("fp8.position");
    const auto position = record ? record->values<std::int64_t>() : std::vector<std::int64_t>{};
    const std::int64_t history = static_cast<std::int64_t>(fp8.history_values().size) / n;
    AMP_REQUIRE(position.size() == 1 && position[0] >= 0 && position[0] < history, "checkpoint '", path,
                "' has FP8 scales but no 'fp8.position' record of one value in [0, ", history, ")");
  }
  for (const auto& [name, r] : a.records()) {
    if (name.rfind("extra.", 0) == 0) continue;
    AMP_REQUIRE(std::find(expected.begin(), expected.end(), name) != expected.end(), "checkpoint '", path,
                "' has tensor '", name, "', which this model does not have (saved from another model?)");
  }
  const auto step = a.find("optim.step")->values<std::int64_t>();
  const auto pows = a.find("optim.pows")->values<float>();
  const auto counters = a.find("scaler.counters")->values<std::int64_t>();
  const auto scale = a.find("scaler.scale")->values<float>();
  const auto forwards = a.find("model.forwards")->values<std::int64_t>();
  AMP_REQUIRE(step.size() == 2 && pows.size() == 2 && counters.size() == 5 && scale.size() == 1 && forwards.size() == 1,
              "checkpoint '", path, "': optimizer or scaler state has the wrong length");

  // Sound: apply.
  for (const auto& p : store.table()) {
    const int index = static_cast<int>(&p - store.table().data());
    if (p.kind == nn::role::buffer) {
      store.set_values(index, detail::as_fp32(*a.find("buffer." + p.name)));
      continue;
    }
    const Record& stored = *a.find("param." + p.name);
    const Record* master = a.find("master." + p.name);
    auto exact = [&](auto& group) {
      using Group = std::remove_reference_t<decltype(group)>;
      using S = typename Group::stored_type;
      if (!same_policy || stored.type != detail::dtype_of<S>() || Group::has_master != (master != nullptr)) return false;
      upload(ctx, group.values().subspan(p.offset, p.count), stored.values<S>());
      if constexpr (Group::has_master)
        if (const nn::Part q = store.part(p); q.size())
          upload(ctx, group.master().subspan(store.shard_offset(p) + q.begin, q.size()),
                 master->values<float>().data() + q.begin, q.size());
      return true;
    };
    const bool restored = store.with_arena(p.kind, exact);
    if (!restored) store.set_values(index, detail::as_fp32(master ? *master : stored));  // a policy conversion
    const nn::Part q = store.part(p);  // ZeRO-1: the elements in this rank's shard
    if (!q.size()) continue;
    for (int k = 0; k < Optimizer::state_buffers; ++k) {
      const Span<float> s = detail::state_of(opt, p.kind, k, slot);
      const auto v = detail::as_fp32(*a.find("optim." + std::to_string(k) + "." + p.name));
      upload(ctx, s.subspan(store.shard_offset(p) + q.begin, q.size()), v.data() + q.begin, q.size());
    }
  }
  store.mark_updated();
  opt.set_state({step[0], pows[0], pows[1]});
  opt.set_steps(step[1]);
  if (detail::meta_value(m, "scaling") == std::to_string(static_cast<int>(P::loss_scaling))) {
    ScalerState sc;
    sc.scale = scale[0];
    sc.growth_tracker = static_cast<int>(counters[0]), sc.hysteresis_left = static_cast<int>(counters[1]);
    sc.consecutive_skips = static_cast<int>(counters[2]), sc.steps = counters[3], sc.skipped = counters[4];
    opt.scaler().set_state(sc);
  }  // else: another scaling mode (a policy conversion); the scaler starts afresh
  model.graph().set_forward_count(static_cast<std::uint64_t>(forwards[0]));
  if (fp8_state) {
    upload(ctx, fp8.history_values(), a.find("fp8.history")->values<float>());
    upload(ctx, fp8.amax_values(), a.find("fp8.amax")->values<float>());
    upload(ctx, fp8.scale_values(), a.find("fp8.scale")->values<float>());
    const auto position = static_cast<std::int32_t>(a.find("fp8.position")->values<std::int64_t>()[0]);
    upload(ctx, fp8.position(), &position, 1);
    fp8.refresh_inverses();
  } else if (fp8.operands() > 0) {
    fp8.reset();
  }
  Archive extra;
  for (const auto& [name, r] : a.records())
    if (name.rfind("extra.", 0) == 0) extra.put(name.substr(6), r.type, r.shape, r.payload.data(), r.payload.size());
  return extra;
}

}  // namespace amp::io
