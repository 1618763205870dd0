// Caffe2's cell nonlinearities, written so that GCC vectorises the gate loops (shared by every kernel).
//
// Caffe2's LSTMUnit (perfkernels/lstm_unit_cpu-impl.h) uses sigmoid(x) = 1 / (1 + exp(-x)) and
// host_tanh(x) = 2 * sigmoid(2x) - 1; the pure lowering (rnn2jax/ops/rnn_units.py) computes the same
// formulas. glibc's vector expf is used only under -ffast-math, whose reassociation would break the
// round-to-integer step below, hence this branch-free Cephes expf (about 1 ulp on the reduced range).
#pragma once
#include <bit>
#include <cstdint>

namespace rnn2jax {

// The input is clamped so that 2^k stays a normal float: exp(88.38) is about 2.4e38, and 1 / (1 + that)
// is about 4e-39 where a libm expf overflows to inf and gives exactly 0.
static inline float exp_approx(float x) {
  x = x < -87.33654f ? -87.33654f : x;
  x = x > 88.37626f ? 88.37626f : x;
  const float kShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to the nearest integer
  float kf = x * 1.44269504088896341f + kShift;
  const int32_t ki = std::bit_cast<int32_t>(kf) - std::bit_cast<int32_t>(kShift);
  kf -= kShift;
  float r = x - kf * 0.693359375f;
  r = r - kf * -2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((ki + 127) << 23);
  return p * scale;
}

static inline float sigmoid(float x) { return 1.0f / (1.0f + exp_approx(-x)); }

static inline float host_tanh(float x) { return 2.0f / (1.0f + exp_approx(-2.0f * x)) - 1.0f; }

}  // namespace rnn2jax
