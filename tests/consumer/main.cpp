// Uses the public contract: policies, a host context, an arena and the GEMM.
#include <amp/amp.hpp>

#include <cstdio>
#include <vector>

int main() {
  using P = amp::O2Policy;
  static_assert(amp::Policy<P>);
  amp::Context<amp::host> ctx;
  std::vector<P::param_type> a(4, amp::cast<P::param_type>(1.0f));
  std::vector<float> c(4, 0.0f);
  const amp::Matrix<const P::param_type> m{a.data(), 2, 2, 2};
  amp::gemm(ctx, m, amp::transpose::no, m, amp::transpose::no, amp::matrix(c.data(), 2, 2));
  if (c[0] != 2.0f) return 1;
  std::printf("consumer OK (%s, %.1f)\n", std::string(amp::policy_name<P>()).c_str(), c[0]);
  return 0;
}
