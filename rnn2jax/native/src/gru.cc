// One layer of Caffe2's GRU (RecurrentNetwork over its FC / Sum / Sigmoid / Mul / Concat / GRUUnit step net)
// as one XLA FFI call on CPU: the whole recurrence, forward and backward, with oneDNN GEMMs and fused gate
// passes per step.
//
// Forward (rnn2jax_gru_forward / rnn2jax_gru_forward_train / rnn2jax_gru_forward_fc):
//   in:  x [T, N, 3H] (the input projection, blocks r, u, o), h0 [N, H], w [3H, H] (Wr, Wu, Wo stacked: each
//        FC is rows w^T + b), b [3H] (br, bu, bo), lengths [N] int32 in [0, T].
//   attrs: linear_before_reset (i32 0/1), drop_states (i32 0/1).
//   out: h [T, N, H]; the training form also writes the activated gates r, u, o [T, N, H] and, with
//        linear_before_reset, o_fc = h_{t-1} Wo^T + bo [T, N, H] (else an empty buffer; all zero on rows past
//        their length); the fc form writes instead the step's three FC outputs [T, N, 3H] on every row (the
//        step net computes them on rows past their length too), from which the blobs a backward step net
//        reads follow elementwise (gru_vjp._step_values), with no GEMM after the loop.
//   Per step, on rows inside their sequence (t < lengths[n]), in the step net's order (FC, then Sum):
//     fc_r = h Wr^T + br, fc_u = h Wu^T + bu, r = sigmoid(fc_r + x_r), u = sigmoid(fc_u + x_u),
//     o = tanh(((r * h) Wo^T + bo) + x_o)       (linear_before_reset = 0: a second GEMM, on r * h)
//     o = tanh(r * (h Wo^T + bo) + x_o)         (linear_before_reset = 1: one GEMM for all three blocks)
//     h_t = u * h + (1 - u) * o                 (GRUUnit; its tanh is accurate, not 2 sigmoid(2x) - 1)
//   other rows keep h (drop_states: zero).
//
// Backward (rnn2jax_gru_backward):
//   in:  w, h0, h, r, u, o, o_fc (empty without linear_before_reset), lengths as above; dh [T, N, H] (the
//        cotangent of the hidden rows, the final state's added at T-1).
//   attrs: linear_before_reset, drop_states.
//   out: dgates [T, N, 3H] (d of the pre-activations r, u, o = d x, since x enters them additively), dh0.
//   Per step, t = T-1 .. 0, the GRU's elementwise backward on rows inside their sequence, then dh_{t-1} from
//   one GEMM (two without linear_before_reset: d(r * h) = do Wo first); rows past their length pass dh
//   through (drop_states: zero). The weight gradients are contractions over all steps, done by XLA after.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "cell_math.h"
#include "kernel_common.h"

namespace rnn2jax {
namespace {

using ffi::Buffer;
using ffi::F32;
using ffi::ResultBuffer;
using ffi::S32;

// GRUUnit's tanh: Caffe2 computes 2 sigmoid(2x) - 1 with a correctly rounded sigmoid, which is tanh to
// float32 rounding (rnn_units.gru_tanh). Cephes' tanhf, branch-free so that the gate loops vectorise: an odd
// polynomial below |x| = 0.625, 1 - 2 / (exp(2|x|) + 1) above (about 2 ulp).
static inline float accurate_tanh(float x) {
  const float a = std::fabs(x);
  const float z = x * x;
  const float small =
      ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z + 1.33314422036e-1f) * z -
       3.33332819422e-1f) *
          z * x +
      x;
  const float large = std::copysign(1.0f - 2.0f / (exp_approx(2.0f * a) + 1.0f), x);
  return a > 0.625f ? large : small;
}

// linear_before_reset = 0, first pass (every row): r, u from the r/u GEMM, and r * h for the second GEMM.
__attribute__((noinline)) void reset_update_row(int64_t H, const float* __restrict gemm, const float* __restrict x,
                                                const float* __restrict b, const float* __restrict h_prev,
                                                float* __restrict r_out, float* __restrict u_out,
                                                float* __restrict rh_out) {
  for (int64_t d = 0; d < H; ++d) {
    const float r = sigmoid(gemm[d] + b[d] + x[d]);
    r_out[d] = r;
    u_out[d] = sigmoid(gemm[H + d] + b[H + d] + x[H + d]);
    rh_out[d] = r * h_prev[d];
  }
}

// linear_before_reset = 0, second pass (rows inside their sequence): o from the Wo GEMM, and the new h.
__attribute__((noinline)) void output_row(int64_t H, const float* __restrict gemm_o, const float* __restrict x_o,
                                          const float* __restrict bo, const float* __restrict u,
                                          const float* __restrict h_prev, float* __restrict o_out,
                                          float* __restrict h_out) {
  for (int64_t d = 0; d < H; ++d) {
    const float o = accurate_tanh(gemm_o[d] + bo[d] + x_o[d]);
    o_out[d] = o;
    h_out[d] = u[d] * h_prev[d] + (1.0f - u[d]) * o;
  }
}

// linear_before_reset = 1 (rows inside their sequence): all three gates from the one GEMM, and the new h.
__attribute__((noinline)) void linear_row(int64_t H, const float* __restrict gemm, const float* __restrict x,
                                          const float* __restrict b, const float* __restrict h_prev,
                                          float* __restrict r_out, float* __restrict u_out, float* __restrict o_out,
                                          float* __restrict o_fc_out, float* __restrict h_out) {
  for (int64_t d = 0; d < H; ++d) {
    const float r = sigmoid(gemm[d] + b[d] + x[d]);
    const float u = sigmoid(gemm[H + d] + b[H + d] + x[H + d]);
    const float o_fc = gemm[2 * H + d] + b[2 * H + d];
    const float o = accurate_tanh(r * o_fc + x[2 * H + d]);
    r_out[d] = r;
    u_out[d] = u;
    o_out[d] = o;
    o_fc_out[d] = o_fc;
    h_out[d] = u * h_prev[d] + (1.0f - u) * o;
  }
}

// The fc form (every row): the step's FC outputs, the r and u blocks from the first GEMM and the o block from
// the GEMM that computes it (the same one with linear_before_reset, the second otherwise), plus the biases;
// the sums are the gate loops' own, so the pre-activations derived from these equal the ones the step used.
__attribute__((noinline)) void fc_row(int64_t H, const float* __restrict gemm_ru, const float* __restrict gemm_o,
                                      const float* __restrict b, float* __restrict fc_out) {
  for (int64_t d = 0; d < 2 * H; ++d) fc_out[d] = gemm_ru[d] + b[d];
  for (int64_t d = 0; d < H; ++d) fc_out[2 * H + d] = gemm_o[d] + b[2 * H + d];
}

// Backward, first pass (rows inside their sequence): du, do (and with linear_before_reset dr and d o_fc,
// into `dgemm`, the rows the dh_{t-1} GEMM reads), and the direct term dh_{t-1} = dh * u.
__attribute__((noinline)) void backward_row(int64_t H, int32_t lbr, const float* __restrict r,
                                            const float* __restrict u, const float* __restrict o,
                                            const float* __restrict o_fc, const float* __restrict h_prev,
                                            const float* __restrict dh, float* __restrict dgates,
                                            float* __restrict dgemm, float* __restrict dh_prev) {
  for (int64_t d = 0; d < H; ++d) {
    const float du = dh[d] * (h_prev[d] - o[d]) * u[d] * (1.0f - u[d]);
    const float dout = dh[d] * (1.0f - u[d]) * (1.0f - o[d] * o[d]);
    dgates[H + d] = du;
    dgates[2 * H + d] = dout;
    dh_prev[d] = dh[d] * u[d];
    if (lbr) {
      const float dr = dout * o_fc[d] * r[d] * (1.0f - r[d]);
      dgates[d] = dr;
      dgemm[d] = dr;
      dgemm[H + d] = du;
      dgemm[2 * H + d] = dout * r[d];
    }
  }
}

// Backward, linear_before_reset = 0, second pass: from d(r * h) = do Wo, dr and dh_{t-1}'s term d(r * h) * r.
__attribute__((noinline)) void reset_backward_row(int64_t H, const float* __restrict r, const float* __restrict h_prev,
                                                  const float* __restrict d_rh, float* __restrict dgates,
                                                  float* __restrict dh_prev) {
  for (int64_t d = 0; d < H; ++d) {
    dgates[d] = d_rh[d] * h_prev[d] * r[d] * (1.0f - r[d]);
    dh_prev[d] += d_rh[d] * r[d];
  }
}

struct Saved {
  float *r = nullptr, *u = nullptr, *o = nullptr, *o_fc = nullptr;
};

// `saved` (the training form) or `fc_all` (the fc form, [T, N, 3H]) may be null.
ffi::Error forward(ffi::ThreadPool pool, Buffer<F32> x, Buffer<F32> h0, Buffer<F32> w, Buffer<F32> b,
                   Buffer<S32> lengths, int32_t lbr, int32_t drop_states, float* h_all, Saved saved,
                   float* fc_all = nullptr) {
  const auto dims = x.dimensions();
  if (dims.size() != 3 || dims[2] % 3) return ffi::Error::InvalidArgument("rnn2jax_gru_forward: x must be [T, N, 3H]");
  const int64_t T = dims[0], N = dims[1], G = dims[2], H = G / 3;
  if (count(h0) != N * H || count(w) != G * H || count(lengths) != N || count(b) != G)
    return ffi::Error::InvalidArgument("rnn2jax_gru_forward: inconsistent shapes");
  const XlaThreads threads(pool, N * G * H);  // a step's GEMMs: 3 N H^2 multiply-adds
  const float* X = x.typed_data();
  const float* W = w.typed_data();
  const float* B = b.typed_data();
  const int32_t* L = lengths.typed_data();
  const int64_t width = lbr ? G : 2 * H;  // the first GEMM's blocks
  std::vector<float> gemm(static_cast<size_t>(N * width)), gemm_o(lbr ? 0 : N * H), rh(lbr ? 0 : N * H);
  // r, u, o of the current step when they are not saved; o_fc is never needed then
  std::vector<float> r_tmp(saved.r ? 0 : N * H), u_tmp(saved.r ? 0 : N * H), o_tmp(saved.r ? 0 : N * H),
      o_fc_tmp(saved.r || !lbr ? 0 : N * H);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t at = t * N * H;
    const float* hp = t == 0 ? h0.typed_data() : h_all + at - N * H;
    float* R = saved.r ? saved.r + at : r_tmp.data();
    float* U = saved.r ? saved.u + at : u_tmp.data();
    float* O = saved.r ? saved.o + at : o_tmp.data();
    float* OF = lbr ? (saved.r ? saved.o_fc + at : o_fc_tmp.data()) : nullptr;
    sgemm('N', 'T', N, width, H, 1.0f, hp, H, W, H, 0.0f, gemm.data(), width);
    if (!lbr) {
#pragma omp parallel for schedule(static) if (parallel_rows(N, G))
      for (int64_t n = 0; n < N; ++n)
        reset_update_row(H, gemm.data() + n * width, X + (t * N + n) * G, B, hp + n * H, R + n * H, U + n * H,
                         rh.data() + n * H);
      sgemm('N', 'T', N, H, H, 1.0f, rh.data(), H, W + 2 * H * H, H, 0.0f, gemm_o.data(), H);
    }
#pragma omp parallel for schedule(static) if (parallel_rows(N, G))
    for (int64_t n = 0; n < N; ++n) {
      const int64_t row = n * H;
      float* h = h_all + at + row;
      if (fc_all) {
        const float* ru = gemm.data() + n * width;
        fc_row(H, ru, lbr ? ru + 2 * H : gemm_o.data() + row, B, fc_all + (t * N + n) * G);
      }
      if (t < L[n]) {
        const float* xr = X + (t * N + n) * G;
        if (lbr)
          linear_row(H, gemm.data() + n * width, xr, B, hp + row, R + row, U + row, O + row, OF + row, h);
        else
          output_row(H, gemm_o.data() + row, xr + 2 * H, B + 2 * H, U + row, hp + row, O + row, h);
        continue;
      }
      if (saved.r)
        for (float* p : {R, U, O, OF})
          if (p) std::memset(p + row, 0, sizeof(float) * H);
      if (drop_states)
        std::memset(h, 0, sizeof(float) * H);
      else
        std::memcpy(h, hp + row, sizeof(float) * H);
    }
  }
  return ffi::Error::Success();
}

ffi::Error Forward(ffi::ThreadPool pool, Buffer<F32> x, Buffer<F32> h0, Buffer<F32> w, Buffer<F32> b,
                   Buffer<S32> lengths, int32_t lbr, int32_t drop_states, ResultBuffer<F32> h) {
  return guarded("rnn2jax_gru_forward",
                 [&] { return forward(pool, x, h0, w, b, lengths, lbr, drop_states, h->typed_data(), Saved{}); });
}

ffi::Error ForwardFc(ffi::ThreadPool pool, Buffer<F32> x, Buffer<F32> h0, Buffer<F32> w, Buffer<F32> b,
                     Buffer<S32> lengths, int32_t lbr, int32_t drop_states, ResultBuffer<F32> h, ResultBuffer<F32> fc) {
  return guarded("rnn2jax_gru_forward_fc", [&] {
    if (count(*fc) != count(x)) return ffi::Error::InvalidArgument("rnn2jax_gru_forward_fc: fc must be [T, N, 3H]");
    return forward(pool, x, h0, w, b, lengths, lbr, drop_states, h->typed_data(), Saved{}, fc->typed_data());
  });
}

ffi::Error ForwardTrain(ffi::ThreadPool pool, Buffer<F32> x, Buffer<F32> h0, Buffer<F32> w, Buffer<F32> b,
                        Buffer<S32> lengths, int32_t lbr, int32_t drop_states, ResultBuffer<F32> h, ResultBuffer<F32> r,
                        ResultBuffer<F32> u, ResultBuffer<F32> o, ResultBuffer<F32> o_fc) {
  return guarded("rnn2jax_gru_forward_train", [&] {
    if (count(*o_fc) != (lbr ? count(*h) : 0))
      return ffi::Error::InvalidArgument("rnn2jax_gru_forward_train: o_fc must be [T, N, H] exactly with lbr");
    Saved saved{r->typed_data(), u->typed_data(), o->typed_data(), lbr ? o_fc->typed_data() : nullptr};
    return forward(pool, x, h0, w, b, lengths, lbr, drop_states, h->typed_data(), saved);
  });
}

ffi::Error backward(ffi::ThreadPool pool, Buffer<F32> w, Buffer<F32> h0, Buffer<F32> h_all, Buffer<F32> r_all,
                    Buffer<F32> u_all, Buffer<F32> o_all, Buffer<F32> o_fc_all, Buffer<S32> lengths,
                    Buffer<F32> dh_all, int32_t lbr, int32_t drop_states, ResultBuffer<F32> dgates_all,
                    ResultBuffer<F32> dh0) {
  const auto dims = h_all.dimensions();
  if (dims.size() != 3) return ffi::Error::InvalidArgument("rnn2jax_gru_backward: h must be [T, N, H]");
  const int64_t T = dims[0], N = dims[1], H = dims[2], G = 3 * H, size = T * N * H;
  if (count(w) != G * H || count(h0) != N * H || count(lengths) != N || count(r_all) != size ||
      count(u_all) != size || count(o_all) != size || count(o_fc_all) != (lbr ? size : 0) || count(dh_all) != size)
    return ffi::Error::InvalidArgument("rnn2jax_gru_backward: inconsistent shapes");
  const XlaThreads threads(pool, N * G * H);  // a step's GEMMs: 3 N H^2 multiply-adds
  const float* Hs = h_all.typed_data();
  const float* R = r_all.typed_data();
  const float* U = u_all.typed_data();
  const float* O = o_all.typed_data();
  const float* OF = lbr ? o_fc_all.typed_data() : nullptr;
  const float* DH = dh_all.typed_data();
  const int32_t* L = lengths.typed_data();
  float* DG = dgates_all->typed_data();
  // dh_{t-1} = dgates_t w as 'N','T' against a transposed copy [H, 3H], as lstm.cc does (faster in oneDNN)
  std::vector<float> wt(static_cast<size_t>(G * H));
  const float* W = w.typed_data();
  for (int64_t r = 0; r < G; ++r)
    for (int64_t col = 0; col < H; ++col) wt[col * G + r] = W[r * H + col];
  // dh_carry: the cotangent flowing into h_t from step t + 1 (then into h_{t-1}); dh: this step's total
  std::vector<float> dh_carry(N * H, 0.0f), dh(N * H), dgemm(lbr ? N * G : 0), d_rh(lbr ? 0 : N * H);
  for (int64_t t = T - 1; t >= 0; --t) {
    const int64_t at = t * N * H;
    const float* hp = t == 0 ? h0.typed_data() : Hs + at - N * H;
    float* dgt = DG + t * N * G;
    for (int64_t k = 0; k < N * H; ++k) dh[k] = dh_carry[k] + DH[at + k];
#pragma omp parallel for schedule(static) if (parallel_rows(N, G))
    for (int64_t n = 0; n < N; ++n) {
      const int64_t row = n * H;
      if (t < L[n]) {
        backward_row(H, lbr, R + at + row, U + at + row, O + at + row, lbr ? OF + at + row : nullptr, hp + row,
                     dh.data() + row, dgt + n * G, lbr ? dgemm.data() + n * G : nullptr, dh_carry.data() + row);
        continue;
      }
      std::memset(dgt + n * G, 0, sizeof(float) * G);
      if (lbr) std::memset(dgemm.data() + n * G, 0, sizeof(float) * G);
      if (drop_states)
        std::memset(dh_carry.data() + row, 0, sizeof(float) * H);
      else
        std::memcpy(dh_carry.data() + row, dh.data() + row, sizeof(float) * H);
    }
    if (lbr) {
      sgemm('N', 'T', N, H, G, 1.0f, dgemm.data(), G, wt.data(), G, 1.0f, dh_carry.data(), H);
      continue;
    }
    // d(r * h) = do Wo; rows past their length have do = 0, so theirs is 0 and they keep dh_carry as set
    sgemm('N', 'T', N, H, H, 1.0f, dgt + 2 * H, G, wt.data() + 2 * H, G, 0.0f, d_rh.data(), H);
#pragma omp parallel for schedule(static) if (parallel_rows(N, G))
    for (int64_t n = 0; n < N; ++n)
      if (t < L[n])
        reset_backward_row(H, R + at + n * H, hp + n * H, d_rh.data() + n * H, dgt + n * G,
                           dh_carry.data() + n * H);
    sgemm('N', 'T', N, H, 2 * H, 1.0f, dgt, G, wt.data(), G, 1.0f, dh_carry.data(), H);
  }
  std::memcpy(dh0->typed_data(), dh_carry.data(), sizeof(float) * N * H);
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::ThreadPool pool, Buffer<F32> w, Buffer<F32> h0, Buffer<F32> h_all, Buffer<F32> r_all,
                    Buffer<F32> u_all, Buffer<F32> o_all, Buffer<F32> o_fc_all, Buffer<S32> lengths,
                    Buffer<F32> dh_all, int32_t lbr, int32_t drop_states, ResultBuffer<F32> dgates_all,
                    ResultBuffer<F32> dh0) {
  return guarded("rnn2jax_gru_backward", [&] {
    return backward(pool, w, h0, h_all, r_all, u_all, o_all, o_fc_all, lengths, dh_all, lbr, drop_states, dgates_all,
                    dh0);
  });
}

}  // namespace
}  // namespace rnn2jax

namespace ffi = xla::ffi;
using F32Buffer = ffi::Buffer<ffi::F32>;

// XLA_FFI_DEFINE_HANDLER_SYMBOL declares plain extern "C" symbols; -fvisibility=hidden would hide them.
#pragma GCC visibility push(default)
// The three forward forms take the same operands and attributes; they differ in what they return.
static auto ForwardBinding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<F32Buffer>()              // x
      .Arg<F32Buffer>()              // h0
      .Arg<F32Buffer>()              // w
      .Arg<F32Buffer>()              // b (br, bu, bo)
      .Arg<ffi::Buffer<ffi::S32>>()  // lengths
      .Attr<int32_t>("linear_before_reset")
      .Attr<int32_t>("drop_states");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(rnn2jax_gru_forward, rnn2jax::Forward, ForwardBinding().Ret<F32Buffer>());  // h
XLA_FFI_DEFINE_HANDLER_SYMBOL(rnn2jax_gru_forward_fc, rnn2jax::ForwardFc,
                              ForwardBinding()
                                  .Ret<F32Buffer>()    // h
                                  .Ret<F32Buffer>());  // the step's FC outputs [T, N, 3H]
XLA_FFI_DEFINE_HANDLER_SYMBOL(rnn2jax_gru_forward_train, rnn2jax::ForwardTrain,
                              ForwardBinding()
                                  .Ret<F32Buffer>()    // h
                                  .Ret<F32Buffer>()    // r
                                  .Ret<F32Buffer>()    // u
                                  .Ret<F32Buffer>()    // o
                                  .Ret<F32Buffer>());  // o_fc (empty without linear_before_reset)
XLA_FFI_DEFINE_HANDLER_SYMBOL(rnn2jax_gru_backward, rnn2jax::Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<F32Buffer>()  // w
                                  .Arg<F32Buffer>()  // h0
                                  .Arg<F32Buffer>()  // h
                                  .Arg<F32Buffer>()  // r
                                  .Arg<F32Buffer>()  // u
                                  .Arg<F32Buffer>()  // o
                                  .Arg<F32Buffer>()  // o_fc (empty without linear_before_reset)
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lengths
                                  .Arg<F32Buffer>()  // dh
                                  .Attr<int32_t>("linear_before_reset")
                                  .Attr<int32_t>("drop_states")
                                  .Ret<F32Buffer>()  // dgates
                                  .Ret<F32Buffer>());  // dh0
#pragma GCC visibility pop
