#pragma once
// An optimizer's learning rate and weight decay as its step reads them: in
// backend memory (Hyper), changed by set_lr / set_schedule between steps and
// never per step, so a captured step follows a schedule by itself.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iterator>
#include <vector>

#include "amp/backend/buffer.hpp"
#include "amp/optim/options.hpp"
#include "amp/optim/step.hpp"

namespace amp::optim {

template <Backend B>
class LearningRate {
 public:
  LearningRate(Context<B>& ctx, float lr, float weight_decay, const std::vector<ParamGroup>& groups)
      : ctx_(&ctx), lr_(lr), base_lr_(lr), hyper_(ctx, 1, memory_kind::optimizer) {
    AMP_REQUIRE(lr >= 0 && std::isfinite(lr), "optimizer: learning rate must be finite and >= 0, got ", lr);
    AMP_REQUIRE(groups.size() + 1 <= max_groups, "optimizer: at most ", max_groups - 1, " parameter groups");
    std::fill(std::begin(hyper_host_.own_lr), std::end(hyper_host_.own_lr), -1.0f);
    std::fill(std::begin(hyper_host_.wd), std::end(hyper_host_.wd), weight_decay);
    for (std::size_t k = 0; k < groups.size(); ++k) {
      if (groups[k].lr) hyper_host_.own_lr[k + 1] = *groups[k].lr;  // a schedule scales every group alike
      if (groups[k].weight_decay) hyper_host_.wd[k + 1] = *groups[k].weight_decay;
    }
    upload_hyper();
  }

  // The rate at step `steps`, evaluated on the host.
  float at(std::int64_t steps) const {
    if (!scheduled_) return lr_;
    Schedule here = schedule_;
    if (here.k == Schedule::kind::table) here.table = table_.data();  // the host's copy
    return here(steps);
  }
  void set_lr(float lr) {
    AMP_REQUIRE(lr >= 0 && std::isfinite(lr), "optimizer: set_lr(", lr, "): the rate must be finite and >= 0");
    lr_ = lr, scheduled_ = false;
    upload_hyper();
  }
  void set_schedule(Schedule schedule) {
    if (schedule.base_lr == Schedule::optimizer_lr) schedule.base_lr = lr_;
    const auto need = [](bool ok, const char* what, auto got) {
      AMP_REQUIRE(ok, "optimizer: set_schedule: need ", what, ", got ", got);
    };
    need(schedule.step_size > 0, "step_size > 0", schedule.step_size);
    need(schedule.total_steps > 0, "total_steps > 0", schedule.total_steps);
    need(schedule.warmup_steps >= 0, "warmup_steps >= 0", schedule.warmup_steps);
    need(std::isfinite(schedule.base_lr) && schedule.base_lr >= 0, "a finite base_lr >= 0", schedule.base_lr);
    need(std::isfinite(schedule.min_lr) && schedule.min_lr >= 0, "a finite min_lr >= 0", schedule.min_lr);
    AMP_REQUIRE(schedule.k != Schedule::kind::table || schedule.table == table_device_.data(),
                "optimizer: set_schedule: a table schedule comes from set_schedule(function, steps)");
    schedule_ = schedule, scheduled_ = true;
    upload_hyper();
  }
  void set_schedule(const std::function<float(std::int64_t)>& rate, std::int64_t steps) {
    AMP_REQUIRE(rate && steps > 0, "optimizer: set_schedule(function, steps): need a function and steps > 0, got ",
                steps);
    std::vector<float> table(static_cast<std::size_t>(steps));
    for (std::int64_t i = 0; i < steps; ++i) {
      const float r = rate(i);
      AMP_REQUIRE(std::isfinite(r) && r >= 0, "optimizer: set_schedule: the rate of step ", i, " is ", r,
                  "; rates must be finite and >= 0");
      table[static_cast<std::size_t>(i)] = r;
    }
    // The step reads the table's address from the hyper-parameters in backend
    // memory too, so a captured step follows a new table.
    table_device_ = Buffer<float, B>(*ctx_, table.size(), memory_kind::optimizer);
    upload(*ctx_, table_device_.span(), table);
    table_ = std::move(table);
    Schedule s;
    s.k = Schedule::kind::table, s.base_lr = base_lr_, s.table = table_device_.data(), s.table_size = steps;
    set_schedule(s);
  }
  // What the step's prologue reads.
  const Hyper* hyper() const { return hyper_.data(); }

 private:
  void upload_hyper() {
    Hyper& h = hyper_host_;
    h.lr = lr_, h.base_lr = base_lr_, h.scheduled = scheduled_ ? 1 : 0, h.schedule = schedule_;
    upload(*ctx_, hyper_.span(), &h, 1);
  }

  Context<B>* ctx_;
  float lr_, base_lr_;
  Schedule schedule_;
  bool scheduled_ = false;
  Hyper hyper_host_;               // the groups' rates and decays, and the rate now
  Buffer<Hyper, B> hyper_;
  std::vector<float> table_;       // set_schedule(function, steps): the rates, on the host
  Buffer<float, B> table_device_;  // and in backend memory, where the step reads them
};

}  // namespace amp::optim
