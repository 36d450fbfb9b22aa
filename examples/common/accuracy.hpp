#pragma once
// A classifier's test accuracy: the argmax of its logits per row against the
// labels, on the host, in evaluation mode (the model is back in training
// mode afterwards). Not about training, so not in an example's loop.
#include <cstdint>
#include <vector>

#include <amp/amp.hpp>

namespace examples {

// Fraction of the loader's samples whose largest logit is their label;
// `predictions` (optional) receives each sample's argmax.
template <class Model, amp::Backend B, class Loader>
double accuracy(amp::Context<B>& ctx, Model& model, Loader& test_data, std::vector<std::int32_t>* predictions = nullptr) {
  model.eval();
  std::int64_t correct = 0;
  if (predictions) predictions->clear();
  for (std::int64_t b = 0; b < test_data.batches(); ++b) {
    const auto batch = test_data.batch(b);
    const auto out = model.forward(ctx, batch.x);
    const std::int64_t classes = out.cols();
    const auto logits = amp::download(ctx, out.value().span());
    const auto labels = amp::download(ctx, batch.labels);
    for (std::int64_t row = 0; row < out.rows(); ++row) {
      std::int64_t best = 0;
      for (std::int64_t c = 1; c < classes; ++c)
        if (amp::cast<float>(logits[row * classes + c]) > amp::cast<float>(logits[row * classes + best])) best = c;
      correct += best == labels[static_cast<std::size_t>(row)];
      if (predictions) predictions->push_back(static_cast<std::int32_t>(best));
    }
  }
  model.train();
  return static_cast<double>(correct) / static_cast<double>(test_data.size());
}

}  // namespace examples
