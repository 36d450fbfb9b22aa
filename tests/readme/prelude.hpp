// What the documentation's fragments use without declaring it. Fragments are
// compiled, never linked, so the objects are declarations only.
#pragma once
#include <cstdint>

#include <amp/amp.hpp>
#include <amp/data/idx.hpp>

namespace readme {

namespace nn = amp::nn;
using P = amp::O2Policy;
using B = amp::host;

// A small classifier written as a net struct (784 -> 128 -> 10).
template <class P, class B>
struct Mlp {
  using T = typename P::activation_type;
  nn::Linear<P, B> fc1, fc2;
  explicit Mlp(nn::Builder<P, B> b)
      : fc1(b.child("fc1"), {.in_features = 784, .out_features = 128, .act = amp::activation::relu}),
        fc2(b.child("fc2"), {.in_features = 128, .out_features = 10}) {}
  std::vector<nn::Input> default_inputs() const { return {{amp::Shape{784}}}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<T> x) const { return fc2(g, fc1(g, x)); }
};
using Net = Mlp<P, B>;
using Critic = Mlp<P, B>;

extern int argc;
extern char** argv;
extern amp::Context<B> ctx;
extern nn::Model<P, B, Net> model, enc, dec, gen, disc;
extern nn::Loss<P, B> loss_g, loss_d;
extern amp::TensorView<const float> x, x_real, x_fake;
extern amp::Matrix<const float> ones, zeros;
extern amp::TensorView<const std::int32_t> ids;
extern amp::Span<const std::int32_t> labels;
extern amp::data::LabelledImages set;

}  // namespace readme
