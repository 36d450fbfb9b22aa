#pragma once
// What fashion_mnist's main and its levels share: the run's settings, the data,
// and what one level's training returns. Level<P, B>::run is defined in
// train.hpp and compiled once per level and backend, each in its own
// translation unit (examples/CMakeLists.txt); main.cpp sees only this header.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <amp/backend/backend.hpp>
#include <amp/data/idx.hpp>
#include <amp/model/numerics.hpp>
#include <amp/policy.hpp>

#include "common/fp8.hpp"

namespace fashion_mnist {

inline constexpr std::int64_t classes = 10;

struct Settings {
  std::string model = "mlp", optimizer, schedule, data;
  std::string save, resume, export_to, import_from;  // checkpoint and safetensors paths (empty: none)
  float lr = 0, momentum = 0, mean = 0, stddev = 1;  // the training set's pixel statistics
  std::int64_t batch = 0, train_subset = 0;
  int epochs = 0, threads = 0;
  int numerics = 0;  // --numerics N: the numerics report every N steps (0: off)
  std::uint64_t seed = 0;
  bool tty = false, graph = false;
  bool zero = false;  // --zero 1: ZeRO stage 1 under --distributed
};

// What a level trains on.
struct Job {
  const Settings& settings;
  const amp::data::LabelledImages& train, & test;
};

struct StepLog {
  int epoch;  // from 1, as on the console
  float loss, scale;
  int skipped;  // this step
};

struct EpochLog {
  int epoch;
  double seconds, train_loss, test_accuracy;
  long long skipped, skipped_total;
  float scale;
};

struct ParamRow {
  std::string name, shape, dtype, master_dtype;  // master_dtype empty: no master copy
};

struct LevelResult {
  std::string level, device, device_details;
  bool finished = false;
  std::vector<ParamRow> parameters;
  double accuracy = 0, epoch_seconds = 0, samples_per_second = 0;
  std::size_t peak[static_cast<int>(amp::memory_kind::count)] = {};
  std::size_t peak_total = 0;
  long long skipped = 0;
  // After the first step: what the loop did on the host (zeros: it can be one CUDA graph).
  long long host_syncs_in_loop = 0, allocations_in_loop = 0, pageable_copies_in_loop = 0, launches_per_step = 0;
  long long graph_nodes = 0;  // --graph: the captured step's nodes
  double step_ms = 0;         // the median epoch's time per step
  float final_scale = 0;
  std::vector<EpochLog> epochs;
  std::vector<StepLog> steps;
  std::vector<std::int32_t> predictions;  // the test set's, after the last epoch
  examples::Fp8Summary fp8;               // FP8 levels: layers and final scales
  std::vector<amp::nn::NumericsRow> numerics;  // --numerics
};

// One opt level trained on a fresh context of backend B (alone, or as one rank of --distributed).
template <amp::Policy P, amp::Backend B>
struct Level {
  static LevelResult run(const Job& job);
};

}  // namespace fashion_mnist
