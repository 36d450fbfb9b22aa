#pragma once
// fashion_mnist's own part of a checkpoint: the settings a resumed run must
// share with the run that saved, where it stands (epoch, the loader's order
// and generator) and what it has logged, so a resumed run's JSON and plots
// cover every epoch.
#include <sstream>
#include <string>
#include <vector>

#include <amp/io/archive.hpp>

#include "01_fashion_mnist/job.hpp"

namespace fashion_mnist {

// What a resumed run must agree on with the run that saved (the level may differ: a policy conversion).
inline std::string resume_key(const Settings& s, std::int64_t train_images) {
  std::ostringstream k;
  k << "model=" << s.model << " optimizer=" << s.optimizer << " lr=" << s.lr << " schedule=" << s.schedule
    << " epochs=" << (s.schedule == "cosine" ? s.epochs : 0) << " momentum=" << s.momentum
    << " batch=" << s.batch << " seed=" << s.seed << " train_images=" << train_images;
  return k.str();
}

// The run's own part of a checkpoint: where it stands and what it has logged.
template <class Loader>
amp::io::Archive run_state(const Settings& s, const LevelResult& r, const Loader& loader) {
  using amp::io::dtype;
  amp::io::Archive a;
  a.put_text("settings", resume_key(s, loader.size()));
  a.put_int64("epoch", std::vector<std::int64_t>{r.epochs.back().epoch, r.skipped});
  const auto state = loader.state();
  a.put_int64("loader.order", state.order);
  a.put_text("loader.rng", state.rng);
  std::vector<double> epochs;
  for (const auto& e : r.epochs)
    epochs.insert(epochs.end(), {double(e.epoch), e.seconds, e.train_loss, e.test_accuracy, double(e.skipped),
                                 double(e.skipped_total), double(e.scale)});
  a.put("log.epochs", dtype::fp64, {epochs.size()}, epochs.data(), epochs.size());
  std::vector<float> loss, scale;
  std::vector<std::int64_t> step_epoch, skipped;
  for (const auto& l : r.steps) loss.push_back(l.loss), scale.push_back(l.scale), step_epoch.push_back(l.epoch),
                                skipped.push_back(l.skipped);
  a.put("log.loss", dtype::fp32, {loss.size()}, loss.data(), loss.size());
  a.put("log.scale", dtype::fp32, {scale.size()}, scale.data(), scale.size());
  a.put_int64("log.epoch", step_epoch);
  a.put_int64("log.skipped", skipped);
  return a;
}

// Restores run_state() into the logs and the loader's order and generator; returns the last finished epoch.
inline int restore_run(const Settings& s, const amp::io::Archive& a, LevelResult& r, std::int64_t train_images,
                       std::vector<std::int64_t>& order, std::string& rng) {
  const auto need = [&](const char* name) -> const amp::io::Record* {
    const amp::io::Record* rec = a.find(name);
    AMP_REQUIRE(rec, "--resume '", s.resume, "' is not a fashion_mnist checkpoint (no ", name, ")");
    return rec;
  };
  const std::string saved = need("settings")->text(), now = resume_key(s, train_images);
  AMP_REQUIRE(saved == now, "--resume '", s.resume, "' was saved with ", saved, "; this run has ", now);
  const auto epoch = need("epoch")->values<std::int64_t>();
  order = need("loader.order")->values<std::int64_t>();
  rng = need("loader.rng")->text();
  const auto epochs = need("log.epochs")->values<double>();
  const auto loss = need("log.loss")->values<float>(), scale = need("log.scale")->values<float>();
  const auto step_epoch = need("log.epoch")->values<std::int64_t>(), skipped = need("log.skipped")->values<std::int64_t>();
  AMP_REQUIRE(epoch.size() == 2 && epochs.size() == 7 * static_cast<std::size_t>(epoch[0]) && scale.size() == loss.size() &&
                  step_epoch.size() == loss.size() && skipped.size() == loss.size(),
              "--resume '", s.resume, "': its logs do not fit together");
  for (std::size_t i = 0; i < epochs.size(); i += 7)
    r.epochs.push_back({int(epochs[i]), epochs[i + 1], epochs[i + 2], epochs[i + 3], (long long)epochs[i + 4],
                        (long long)epochs[i + 5], float(epochs[i + 6])});
  for (std::size_t i = 0; i < loss.size(); ++i) r.steps.push_back({int(step_epoch[i]), loss[i], scale[i], int(skipped[i])});
  r.skipped = epoch[1];
  return static_cast<int>(epoch[0]);
}

}  // namespace fashion_mnist
