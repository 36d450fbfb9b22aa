// 01_fashion_mnist: the main job. An MLP 784-256-128-10 or a CNN (two
// conv3x3-BN-ReLU-maxpool stages, then 3136-128-10) trained on the real
// Fashion-MNIST at each opt level, with test accuracy, speed and memory by
// category side by side, the parameter table with its storage types, and a JSON
// summary and a per-step CSV that scripts/plot.py draws. Checkpoints at each
// epoch end (--save), exact resume (--resume), and weights to and from PyTorch
// as safetensors (--export, --import). Data parallel over MPI (and NCCL on
// GPUs) with --distributed yes under mpirun: --batch-size is per rank.
//
// This file is the program around the training: flags, data, tables, files.
// The training of each level is train.hpp's, compiled per level and backend.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

#include <amp/io/file.hpp>
#include <amp/version.hpp>

#include "01_fashion_mnist/job.hpp"
#include "common/args.hpp"
#include "common/distributed.hpp"
#include "common/json.hpp"
#include "common/levels.hpp"
#include "common/loop_table.hpp"
#include "common/numerics.hpp"
#include "common/run.hpp"

namespace {

using namespace fashion_mnist;
using examples::dist;

std::string data_file(const std::string& dir, const std::string& name) {
  for (const std::string& candidate : {dir + "/" + name + ".gz", dir + "/" + name})
    if (std::ifstream(candidate).good()) return candidate;
  amp::fail("data set file '", dir, "/", name, "[.gz]' not found (install Debian's dataset-fashion-mnist, "
            "or point --data at a folder with the IDX files)");
}

// The first n samples (n = 0: all).
amp::data::LabelledImages first(amp::data::LabelledImages set, std::int64_t n) {
  if (n == 0 || n >= set.count) return set;
  set.count = n;
  set.pixels.resize(static_cast<std::size_t>(n * set.rows * set.cols));
  set.labels.resize(static_cast<std::size_t>(n));
  return set;
}

double mib(std::size_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

std::size_t peak(const LevelResult& r, amp::memory_kind k) { return r.peak[static_cast<int>(k)]; }

void print_tables(const std::string& device, const std::vector<LevelResult>& results) {
  using amp::memory_kind;
  std::printf("\nresults on %s\n", device.c_str());
  std::printf("%-8s %8s %9s %10s %11s %8s %12s\n", "level", "test acc", "epoch [s]", "samples/s", "memory MiB",
              "skipped", "final scale");
  for (const auto& r : results)
    std::printf("%-8s %8.4f %9.3f %10.0f %11.2f %8lld %12g\n", r.level.c_str(), r.accuracy, r.epoch_seconds,
                r.samples_per_second, mib(r.peak_total), r.skipped, r.final_scale);
  std::printf("\npeak MiB  weights   master    grads optimizer activations workspace     data\n");
  for (const auto& r : results)
    std::printf("%-8s %8.2f %8.2f %8.2f %9.2f %11.2f %9.2f %8.2f\n", r.level.c_str(), mib(peak(r, memory_kind::weights)),
                mib(peak(r, memory_kind::master)), mib(peak(r, memory_kind::grads)),
                mib(peak(r, memory_kind::optimizer)), mib(peak(r, memory_kind::activations)),
                mib(peak(r, memory_kind::workspace)), mib(peak(r, memory_kind::data)));
  const auto o0 = std::find_if(results.begin(), results.end(), [](const auto& r) { return r.level == "O0"; });
  if (o0 != results.end()) {
    std::printf("\nrelative to O0: weights + activations memory, speed-up, test accuracy\n");
    for (const auto& r : results) {
      const double wa = double(peak(r, memory_kind::weights) + peak(r, memory_kind::activations)) /
                        double(peak(*o0, memory_kind::weights) + peak(*o0, memory_kind::activations));
      std::printf("  %-8s %.3fx memory  %.2fx speed  %+.2f pp\n", r.level.c_str(), wa,
                  o0->epoch_seconds / r.epoch_seconds, 100 * (r.accuracy - o0->accuracy));
    }
  }
  examples::print_loop_counters(results);
}

void print_parameters(const std::vector<LevelResult>& results) {
  for (const auto& r : results) {
    std::printf("\n%s parameters: name, shape, stored type, master copy\n", r.level.c_str());
    for (const auto& p : r.parameters)
      std::printf("  %-20s %-16s %-5s %s\n", p.name.c_str(), p.shape.c_str(), p.dtype.c_str(),
                  p.master_dtype.empty() ? "-" : p.master_dtype.c_str());
    examples::print_fp8(r.level, r.fp8);
  }
}

std::string to_json(const Settings& s, const std::string& device, const std::string& details,
                    std::int64_t train_images, const std::vector<LevelResult>& results, bool complete) {
  examples::Json j;
  j.object().field("program", "fashion_mnist").field("amp_version", AMP_VERSION_STRING).field("complete", complete);
  j.field("world_size", dist.ranks).field("zero", s.zero ? 1 : 0);
  j.field("device", device).field("device_details", details);
  j.key("settings").object().field("model", s.model).field("optimizer", s.optimizer).field("lr", s.lr);
  j.field("schedule", s.schedule).field("momentum", s.optimizer == "sgd" ? s.momentum : 0.0f);
  j.field("batch_size", static_cast<long long>(s.batch));
  j.field("global_batch_size", static_cast<long long>(s.batch * dist.ranks));
  j.field("epochs", s.epochs).field("seed", static_cast<unsigned long long>(s.seed)).field("data", s.data);
  j.field("train_subset", static_cast<long long>(s.train_subset)).field("train_images", static_cast<long long>(train_images));
  j.field("threads", s.threads).field("input_mean", s.mean).field("input_std", s.stddev);
  j.field("resumed_from", s.resume).field("imported", s.import_from).field("graph", s.graph).end();
  j.key("levels").array();
  for (const auto& r : results) {
    j.object().field("opt_level", r.level).field("test_accuracy", r.accuracy).field("epoch_seconds", r.epoch_seconds);
    j.field("samples_per_second", r.samples_per_second).key("peak_bytes").object();
    for (int k = 0; k < static_cast<int>(amp::memory_kind::count); ++k)
      j.field(amp::memory_kind_names[k], static_cast<unsigned long long>(r.peak[k]));
    j.field("total", static_cast<unsigned long long>(r.peak_total)).end();
    j.field("skipped_steps", r.skipped).field("final_loss_scale", r.final_scale);
    j.field("host_syncs_in_loop", r.host_syncs_in_loop).field("allocations_in_loop", r.allocations_in_loop);
    j.field("pageable_copies_in_loop", r.pageable_copies_in_loop).field("launches_per_step", r.launches_per_step);
    j.field("graph_nodes", r.graph_nodes).field("step_ms", r.step_ms);
    examples::json_fp8(j, r.fp8);
    j.key("parameters").array();
    for (const auto& p : r.parameters) {
      j.object().field("name", p.name).field("shape", p.shape).field("dtype", p.dtype).key("master_dtype");
      if (p.master_dtype.empty()) j.null();
      else j.value(p.master_dtype);
      j.end();
    }
    j.end().key("epochs").array();
    for (const auto& e : r.epochs)
      j.object().field("epoch", e.epoch).field("seconds", e.seconds).field("train_loss", e.train_loss)
          .field("test_accuracy", e.test_accuracy).field("skipped_steps", e.skipped).field("loss_scale", e.scale).end();
    j.end().end();
  }
  j.end().end();
  return j.str() + "\n";
}

// index,<level>,...: each finished level's predicted class for each test image.
std::string to_predictions(const std::vector<LevelResult>& results) {
  std::ostringstream c;
  c << "index";
  for (const auto& r : results) c << "," << r.level;
  c << "\n";
  for (std::size_t i = 0; !results.empty() && i < results.front().predictions.size(); ++i) {
    c << i;
    for (const auto& r : results) c << "," << r.predictions[i];
    c << "\n";
  }
  return c.str();
}

std::string to_csv(const std::vector<LevelResult>& results) {
  std::ostringstream c;
  c.precision(9);
  c << "level,epoch,step,loss,loss_scale,skipped\n";
  for (const auto& r : results)
    for (std::size_t i = 0; i < r.steps.size(); ++i) {
      const auto& l = r.steps[i];
      c << r.level << "," << l.epoch << "," << i + 1 << "," << l.loss << "," << l.scale << "," << l.skipped << "\n";
    }
  return c.str();
}

std::string to_numerics_csv(const std::vector<LevelResult>& results) {
  std::vector<examples::LevelNumerics> levels;
  for (const auto& r : results) levels.push_back({r.level, r.numerics});
  return examples::numerics_csv(levels);
}

}  // namespace

int main(int argc, char** argv) try {
  examples::Args args("fashion_mnist",
                      "An MLP or a CNN on Fashion-MNIST at each opt level: accuracy, speed and memory side by side.");
  args.flag("data", "/usr/share/datasets/fashion-mnist", "folder with the IDX files (gzip or raw; MNIST works too)", "DIR")
      .flag("model", "mlp", "mlp (784-256-128-10) or cnn (2 x conv3x3-BN-ReLU-maxpool, 3136-128-10)", "NAME")
      .flag("opt-level", "all", "O0|O1|O2|O3|O1-bf16|O2-bf16|O2-fp8, a comma-separated list, or all", "LEVEL")
      .flag("device", "auto", "auto|cpu|cuda (auto: the GPU when one is present)", "DEVICE")
      .flag("threads", "0", "CPU threads (0: the idle cores; see README)", "N")
      .flag("optimizer", "sgd", "sgd|adam|adamw", "NAME")
      .flag("lr", "0.05", "learning rate", "X")
      .flag("schedule", "constant", "constant, or cosine: anneal the rate per step to 0 over --epochs", "NAME")
      .flag("momentum", "0.9", "SGD momentum", "X")
      .flag("batch-size", "128", "mini-batch size per process (the last partial batch is kept)", "N")
      .flag("epochs", "10", "training epochs", "N")
      .flag("seed", "1", "seed of the initialisation and the shuffling", "N")
      .flag("train-subset", "0", "train on the first N images only (0: all 60000)", "N")
      .flag("json", "", "write the summary (settings, per level and per epoch) as JSON to FILE", "FILE")
      .flag("csv", "", "write every step (level, epoch, step, loss, loss scale, skipped) to FILE", "FILE")
      .flag("numerics", "0", "every N steps, each tensor's zeros, subnormals, overflow, underflow and amax (and FP8 "
            "ranges) into --csv's FILE_numerics.csv, and skipped steps named by tensor; 0: off", "N")
      .flag("predictions", "", "write the test set's predicted classes after training as CSV to FILE", "FILE")
      .flag("save", "", "save a checkpoint to FILE at each epoch end (one --opt-level)", "FILE")
      .flag("resume", "", "resume from a --save checkpoint and train on to --epochs", "FILE")
      .flag("export", "", "write the trained weights as safetensors (PyTorch's names) to FILE", "FILE")
      .flag("import", "", "start from the weights in a safetensors FILE (e.g. from PyTorch)", "FILE")
      .toggle("summary", false, "print each level's parameters with their storage types")
      .toggle("graph", false, "capture the training step once and replay it per batch (a CUDA graph on the GPU)")
      .toggle("distributed", false, "one rank of an MPI job (mpirun -np N ...); --batch-size is per rank")
      .flag("zero", "0", "ZeRO stage under --distributed: 1 = each rank keeps the fp32 masters and optimizer state of "
            "1/ranks of the parameters", "0|1");
  if (!args.parse(argc, argv)) return 0;
  examples::watch_interrupts();  // before any thread starts (see run.hpp)
  if (args.on("distributed")) dist.start(argc, argv, "fashion_mnist");
  Settings s;
  s.model = args.str("model");
  AMP_REQUIRE(s.model == "mlp" || s.model == "cnn", "--model must be mlp or cnn, got '", s.model, "'");
  const bool summary = args.on("summary");
  s.optimizer = args.str("optimizer");
  AMP_REQUIRE(s.optimizer == "sgd" || s.optimizer == "adam" || s.optimizer == "adamw", "--optimizer must be sgd, adam "
              "or adamw, got '", s.optimizer, "'");
  s.lr = static_cast<float>(args.real("lr", 0.0, 10.0, true));
  s.schedule = args.str("schedule");
  AMP_REQUIRE(s.schedule == "constant" || s.schedule == "cosine", "--schedule must be constant or cosine, got '",
              s.schedule, "'");
  s.momentum = static_cast<float>(args.real("momentum", 0.0, 1.0));
  s.batch = args.integer("batch-size", 1, 1 << 20);
  s.epochs = static_cast<int>(args.integer("epochs", 1, 100000));
  s.seed = static_cast<std::uint64_t>(args.integer("seed", 0, std::numeric_limits<long long>::max()));
  s.train_subset = args.integer("train-subset", 0, std::numeric_limits<std::int32_t>::max());
  s.threads = static_cast<int>(args.integer("threads", 0, 4096));
  s.threads = dist.threads(s.threads);  // distributed: the cores, shared out
  s.data = args.str("data");
  s.tty = isatty(fileno(stdout)) != 0;
  s.graph = args.on("graph");
  s.zero = args.integer("zero", 0, 1) == 1;
  s.numerics = static_cast<int>(args.integer("numerics", 0, 1 << 30));
  AMP_REQUIRE(!s.numerics || !args.str("csv").empty(), "--numerics writes its report beside --csv FILE: give --csv too");
  AMP_REQUIRE(!s.numerics || !s.zero, "--numerics reads whole gradients: not with --zero 1");
  AMP_REQUIRE(!s.zero || args.on("distributed"), "--zero 1 shards over the ranks of --distributed yes");
  const auto levels = examples::parse_levels(args.str("opt-level"));
  s.save = args.str("save"), s.resume = args.str("resume"), s.export_to = args.str("export");
  s.import_from = args.str("import");
  for (const char* flag : {"save", "resume", "export", "import"})
    AMP_REQUIRE(args.str(flag).empty() || levels.size() == 1, "--", flag, " needs a single --opt-level, not '",
                args.str("opt-level"), "'");
  AMP_REQUIRE(s.resume.empty() || s.import_from.empty(), "--resume and --import both set the weights: choose one");
  for (const auto& [flag, path] : {std::pair{"--resume", s.resume}, std::pair{"--import", s.import_from}})
    AMP_REQUIRE(path.empty() || std::ifstream(path).good(), flag, " '", path, "' cannot be read");
  for (const auto& [flag, path] : {std::pair{"--save", s.save}, std::pair{"--export", s.export_to}})
    if (!path.empty()) amp::io::check_writable(path, flag);
  const bool gpu = examples::use_gpu(args.str("device"));
  examples::Outputs outputs;  // refused now, not after hours of training; rank 0 writes them
  for (const char* flag : {"json", "csv", "predictions"})
    if (dist.leader()) outputs.add(std::string("--") + flag, args.str(flag));
  if (dist.leader() && s.numerics) outputs.add("--numerics", examples::numerics_path(args.str("csv")));

  const auto train_set = first(amp::data::read_idx_pair(data_file(s.data, "train-images-idx3-ubyte"),
                                                        data_file(s.data, "train-labels-idx1-ubyte"), classes),
                               s.train_subset);
  const auto test_set = amp::data::read_idx_pair(data_file(s.data, "t10k-images-idx3-ubyte"),
                                                 data_file(s.data, "t10k-labels-idx1-ubyte"), classes);
  AMP_REQUIRE(train_set.rows == 28 && train_set.cols == 28, "the training images are ", train_set.rows, "x",
              train_set.cols, ", expected 28x28");
  AMP_REQUIRE(test_set.rows == 28 && test_set.cols == 28, "the test images are ", test_set.rows, "x", test_set.cols,
              ", expected 28x28 like the training images");
  std::tie(s.mean, s.stddev) = amp::data::pixel_statistics(train_set);

  std::string device, details;
  std::vector<LevelResult> results;
  if (dist.leader())
    std::printf("fashion_mnist: %s, %lld train / %lld test, %s lr %g, batch %lld, %d epochs%s\n", s.model.c_str(),
                static_cast<long long>(train_set.count), static_cast<long long>(test_set.count), s.optimizer.c_str(),
                s.lr, static_cast<long long>(s.batch), s.epochs,
                dist.ranks > 1 ? (", " + std::to_string(dist.ranks) + " ranks x batch " + std::to_string(s.batch) +
                                  " = global batch " + std::to_string(dist.ranks * s.batch) + ", " +
                                  std::to_string(std::max(s.threads, 1)) + " threads per rank")
                                     .c_str()
                               : "");
  if (dist.leader() && s.schedule == "cosine")
    std::printf("  learning rate: cosine from %g to 0 over the %d epochs, per step\n", s.lr, s.epochs);
  auto write_outputs = [&](bool complete) {
    outputs.write([&](const std::string& flag) {
                    if (flag == "--json") return to_json(s, device, details, train_set.count, results, complete);
                    if (flag == "--numerics") return to_numerics_csv(results);
                    return flag == "--csv" ? to_csv(results) : to_predictions(results);
                  },
                  /*quiet=*/!complete);
  };
  for (const auto& level : levels) {
    examples::with_policy(level, [&]<amp::Policy P>() {
      LevelResult r = examples::with_backend(gpu, [&]<amp::Backend B>() { return Level<P, B>::run({s, train_set, test_set}); });
      device = r.device, details = r.device_details;
      if (r.finished) results.push_back(std::move(r));
    });
    if (examples::interrupted()) break;
    if (&level != &levels.back()) write_outputs(false);  // a finished level is kept, whatever happens next
  }
  if (!results.empty() && dist.leader()) print_tables(device + (dist.ranks > 1 ? ", rank 0 of " + std::to_string(dist.ranks) : ""), results);
  if (summary && dist.leader()) print_parameters(results);
  if (examples::interrupted()) {
    if (!results.empty()) write_outputs(false);
    std::printf("interrupted: kept the %zu finished level(s)%s\n", results.size(),
                outputs.wants("--json") ? " (the JSON says \"complete\": false)" : "");
    examples::exit_by_signal();
  }
  write_outputs(true);
  return 0;
} catch (const std::exception& e) {
  if (dist.ranks > 1) std::fprintf(stderr, "fashion_mnist (rank %d of %d): %s\n", dist.rank, dist.ranks, e.what());
  else std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
  dist.abort_job();  // the other ranks stop too, instead of waiting for this one
  return 2;
}
