// One layer of Caffe2's LSTM (RecurrentNetwork over FC -> Sum -> LSTMUnit) as one XLA FFI call on CPU:
// the whole recurrence, forward and backward, with one oneDNN GEMM and one fused gate pass per step.
//
// Forward (rnn2jax_lstm_forward / rnn2jax_lstm_forward_train):
//   in:  x [T, N, 4H] (the input projection), h0, c0 [N, H], w [4H, H] and b [4H] (the recurrent FC's
//        weights and the biases: gates = h w^T + x + b), lengths [N] int32 in [0, T].
//   attrs: forget_bias (f32), drop_states (i32 0/1).
//   out: h, c [T, N, H]; the training form also writes the activated gates i, f, o, g [T, N, H] (zero on
//        rows past their length), what the backward needs (oneDNN keeps the same as its RNN workspace);
//        the gates form (rnn2jax_lstm_forward_gates) writes the pre-activations [T, N, 4H] instead, the
//        Sum's output that Caffe2's backward step net reads.
//   Per step: gemm = h_{t-1} w^T; per row inside its sequence (t < lengths[n]) LSTMUnit's maths (gate
//   order i, f, o, g; forget_bias added to f before its sigmoid); other rows keep h, c (drop_states: zero).
//
// Backward (rnn2jax_lstm_backward):
//   in:  w, c0, c, i, f, o, g, lengths as above; dh, dc [T, N, H] (the cotangents of the outputs; an empty
//        buffer means zero); dgates_out [T, N, 4H] (the cotangent of the pre-activations where something
//        reads them; empty means zero).
//   attrs: drop_states.
//   out: dgates [T, N, 4H] (= d x, since x enters the gates additively), dh0, dc0 [N, H].
//   Per step, t = T-1 .. 0: LSTMUnit's elementwise backward on the rows inside their sequence, then
//   dh_{t-1} = dgates_t w (one GEMM); rows past their length pass dh, dc through (drop_states: zero).
//   The weight gradients are one contraction over all steps, done by XLA after the call.
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

// One row inside its sequence: pre-activations -> (h, c), and the activated gates when `ifog` is set.
__attribute__((noinline)) void forward_row(int64_t H, const float* __restrict gemm, const float* __restrict x,
                                           const float* __restrict b, const float* __restrict c_prev, float forget_bias, float* __restrict h_out,
                                           float* __restrict c_out, float* __restrict i_out, float* __restrict f_out,
                                           float* __restrict o_out, float* __restrict g_out) {
  for (int64_t d = 0; d < H; ++d) {
    const float i = sigmoid(gemm[d] + x[d] + b[d]);
    const float f = sigmoid(gemm[H + d] + x[H + d] + b[H + d] + forget_bias);
    const float o = sigmoid(gemm[2 * H + d] + x[2 * H + d] + b[2 * H + d]);
    const float g = host_tanh(gemm[3 * H + d] + x[3 * H + d] + b[3 * H + d]);
    const float c = f * c_prev[d] + i * g;
    c_out[d] = c;
    h_out[d] = o * host_tanh(c);
    if (i_out) {
      i_out[d] = i;
      f_out[d] = f;
      o_out[d] = o;
      g_out[d] = g;
    }
  }
}

// One row inside its sequence, backward: dh, dc are the total cotangents of h_t, c_t. Writes the
// pre-activation gradients and dc_{t-1}; dh_{t-1} comes from the GEMM.
__attribute__((noinline)) void backward_row(int64_t H, const float* __restrict ig, const float* __restrict fg,
                                            const float* __restrict og, const float* __restrict gg,
                                            const float* __restrict c, const float* __restrict c_prev,
                                            const float* __restrict dh, const float* __restrict dc,
                                            float* __restrict dgates, float* __restrict dc_prev) {
  for (int64_t d = 0; d < H; ++d) {
    const float i = ig[d], f = fg[d], o = og[d], g = gg[d];
    const float tc = host_tanh(c[d]);
    const float dct = dc[d] + dh[d] * o * (1.0f - tc * tc);
    dgates[d] = dct * g * i * (1.0f - i);
    dgates[H + d] = dct * c_prev[d] * f * (1.0f - f);
    dgates[2 * H + d] = dh[d] * tc * o * (1.0f - o);
    dgates[3 * H + d] = dct * i * (1.0f - g * g);
    dc_prev[d] = dct * f;
  }
}

struct Gates {
  float *i = nullptr, *f = nullptr, *o = nullptr, *g = nullptr;
};

ffi::Error forward(ffi::ThreadPool pool, Buffer<F32> x, Buffer<F32> h0, Buffer<F32> c0, Buffer<F32> w,
                   Buffer<F32> b, Buffer<S32> lengths, float forget_bias, int32_t drop_states, float* h_all, float* c_all,
                   Gates gates, float* pre = nullptr) {
  const auto dims = x.dimensions();
  if (dims.size() != 3 || dims[2] % 4) return ffi::Error::InvalidArgument("rnn2jax_lstm_forward: x must be [T, N, 4H]");
  const int64_t T = dims[0], N = dims[1], G = dims[2], H = G / 4;
  if (count(h0) != N * H || count(c0) != N * H || count(w) != G * H || count(b) != G || count(lengths) != N)
    return ffi::Error::InvalidArgument("rnn2jax_lstm_forward: inconsistent shapes");
  const XlaThreads threads(pool, N * G * H);
  const float* X = x.typed_data();
  const float* W = w.typed_data();
  const float* B = b.typed_data();
  const int32_t* L = lengths.typed_data();
  std::vector<float> gemm(static_cast<size_t>(N * G));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t at = t * N * H;
    const float* hp = t == 0 ? h0.typed_data() : h_all + at - N * H;
    const float* cp = t == 0 ? c0.typed_data() : c_all + at - N * H;
    sgemm('N', 'T', N, G, H, 1.0f, hp, H, W, H, 0.0f, gemm.data(), G);
#pragma omp parallel for schedule(static) if (parallel_rows(N, G))
    for (int64_t n = 0; n < N; ++n) {
      const int64_t row = at + n * H;
      float* h = h_all + row;
      float* c = c_all + row;
      if (pre) {  // the Sum's output, on every row (a backward step net reads it)
        const float* g = gemm.data() + n * G;
        const float* xr = X + (t * N + n) * G;
        float* p = pre + (t * N + n) * G;
        for (int64_t j = 0; j < G; ++j) p[j] = g[j] + xr[j] + B[j];
      }
      if (t < L[n]) {
        Gates out = gates.i ? Gates{gates.i + row, gates.f + row, gates.o + row, gates.g + row} : Gates{};
        forward_row(H, gemm.data() + n * G, X + (t * N + n) * G, B, cp + n * H, forget_bias, h, c, out.i, out.f, out.o,
                    out.g);
        continue;
      }
      if (gates.i)
        for (float* p : {gates.i, gates.f, gates.o, gates.g}) std::memset(p + row, 0, sizeof(float) * H);
      if (drop_states) {
        std::memset(h, 0, sizeof(float) * H);
        std::memset(c, 0, sizeof(float) * H);
      } else {
        std::memcpy(h, hp + n * H, sizeof(float) * H);
        std::memcpy(c, cp + n * H, sizeof(float) * H);
      }
    }
  }
  return ffi::Error::Success();
}

ffi::Error Forward(ffi::ThreadPool pool, Buffer<F32> x, Buffer<F32> h0, Buffer<F32> c0, Buffer<F32> w,
                   Buffer<F32> b, Buffer<S32> lengths, float forget_bias, int32_t drop_states, ResultBuffer<F32> h,
                   ResultBuffer<F32> c) {
  return guarded("rnn2jax_lstm_forward", [&] {
    return forward(pool, x, h0, c0, w, b, lengths, forget_bias, drop_states, h->typed_data(), c->typed_data(), Gates{});
  });
}

ffi::Error ForwardGates(ffi::ThreadPool pool, Buffer<F32> x, Buffer<F32> h0, Buffer<F32> c0, Buffer<F32> w,
                        Buffer<F32> b, Buffer<S32> lengths, float forget_bias, int32_t drop_states, ResultBuffer<F32> h,
                        ResultBuffer<F32> c, ResultBuffer<F32> pre) {
  return guarded("rnn2jax_lstm_forward_gates", [&] {
    return forward(pool, x, h0, c0, w, b, lengths, forget_bias, drop_states, h->typed_data(), c->typed_data(), Gates{},
                   pre->typed_data());
  });
}

ffi::Error ForwardTrain(ffi::ThreadPool pool, Buffer<F32> x, Buffer<F32> h0, Buffer<F32> c0, Buffer<F32> w,
                        Buffer<F32> b, Buffer<S32> lengths, float forget_bias, int32_t drop_states, ResultBuffer<F32> h,
                        ResultBuffer<F32> c, ResultBuffer<F32> i, ResultBuffer<F32> f, ResultBuffer<F32> o,
                        ResultBuffer<F32> g) {
  return guarded("rnn2jax_lstm_forward_train", [&] {
    Gates gates{i->typed_data(), f->typed_data(), o->typed_data(), g->typed_data()};
    return forward(pool, x, h0, c0, w, b, lengths, forget_bias, drop_states, h->typed_data(), c->typed_data(), gates);
  });
}

ffi::Error backward(ffi::ThreadPool pool, Buffer<F32> w, Buffer<F32> c0, Buffer<F32> c_all, Buffer<F32> i_all,
                    Buffer<F32> f_all, Buffer<F32> o_all, Buffer<F32> g_all, Buffer<S32> lengths, Buffer<F32> dh_all,
                    Buffer<F32> dc_all, Buffer<F32> dgates_out, int32_t drop_states, ResultBuffer<F32> dgates_all,
                    ResultBuffer<F32> dh0, ResultBuffer<F32> dc0) {
  const auto dims = c_all.dimensions();
  if (dims.size() != 3) return ffi::Error::InvalidArgument("rnn2jax_lstm_backward: c must be [T, N, H]");
  const int64_t T = dims[0], N = dims[1], H = dims[2], G = 4 * H, size = T * N * H;
  const bool with_dh = count(dh_all) != 0, with_dc = count(dc_all) != 0;
  const bool with_dgates = count(dgates_out) != 0;
  if (count(w) != G * H || count(c0) != N * H || count(lengths) != N ||
      count(i_all) != size || count(f_all) != size || count(o_all) != size ||
      count(g_all) != size || (with_dh && count(dh_all) != size) ||
      (with_dc && count(dc_all) != size) || (with_dgates && count(dgates_out) != 4 * size))
    return ffi::Error::InvalidArgument("rnn2jax_lstm_backward: inconsistent shapes");
  const XlaThreads threads(pool, N * G * H);
  const float* C = c_all.typed_data();
  const int32_t* L = lengths.typed_data();
  float* DG = dgates_all->typed_data();
  // dh_{t-1} = dgates_t w as 'N','T' against a transposed copy: oneDNN's sgemm runs that orientation up to
  // 1.7x faster on the shapes measured (one fixed choice, so the results never depend on timing).
  std::vector<float> wt(static_cast<size_t>(G * H));
  const float* W = w.typed_data();
  for (int64_t r = 0; r < G; ++r)
    for (int64_t col = 0; col < H; ++col) wt[col * G + r] = W[r * H + col];
  // The carries: cotangents flowing into h_t, c_t from step t + 1, and this step's totals.
  std::vector<float> dh_carry(N * H, 0.0f), dc_carry(N * H, 0.0f), dh(N * H), dc(N * H);
  for (int64_t t = T - 1; t >= 0; --t) {
    const int64_t at = t * N * H;
    const float* cp = t == 0 ? c0.typed_data() : C + at - N * H;
    float* dgt = DG + t * N * G;
    for (int64_t k = 0; k < N * H; ++k) {
      dh[k] = dh_carry[k] + (with_dh ? dh_all.typed_data()[at + k] : 0.0f);
      dc[k] = dc_carry[k] + (with_dc ? dc_all.typed_data()[at + k] : 0.0f);
    }
#pragma omp parallel for schedule(static) if (parallel_rows(N, G))
    for (int64_t n = 0; n < N; ++n) {
      const int64_t row = at + n * H;
      if (t < L[n]) {
        backward_row(H, i_all.typed_data() + row, f_all.typed_data() + row, o_all.typed_data() + row,
                     g_all.typed_data() + row, C + row, cp + n * H, dh.data() + n * H, dc.data() + n * H,
                     dgt + n * G, dc_carry.data() + n * H);
      } else {
        std::memset(dgt + n * G, 0, sizeof(float) * G);
        if (drop_states)
          std::memset(dc_carry.data() + n * H, 0, sizeof(float) * H);
        else
          std::memcpy(dc_carry.data() + n * H, dc.data() + n * H, sizeof(float) * H);
      }
    }
    if (with_dgates) {
      const float* extra = dgates_out.typed_data() + t * N * G;
      for (int64_t k = 0; k < N * G; ++k) dgt[k] += extra[k];
    }
    sgemm('N', 'T', N, H, G, 1.0f, dgt, G, wt.data(), G, 0.0f, dh_carry.data(), H);
    if (!drop_states)
      for (int64_t n = 0; n < N; ++n)
        if (!(t < L[n]))
          for (int64_t d = 0; d < H; ++d) dh_carry[n * H + d] += dh[n * H + d];
  }
  std::memcpy(dh0->typed_data(), dh_carry.data(), sizeof(float) * N * H);
  std::memcpy(dc0->typed_data(), dc_carry.data(), sizeof(float) * N * H);
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::ThreadPool pool, Buffer<F32> w, Buffer<F32> c0, Buffer<F32> c_all, Buffer<F32> i_all,
                    Buffer<F32> f_all, Buffer<F32> o_all, Buffer<F32> g_all, Buffer<S32> lengths, Buffer<F32> dh_all,
                    Buffer<F32> dc_all, Buffer<F32> dgates_out, int32_t drop_states, ResultBuffer<F32> dgates_all,
                    ResultBuffer<F32> dh0, ResultBuffer<F32> dc0) {
  return guarded("rnn2jax_lstm_backward", [&] {
    return backward(pool, w, c0, c_all, i_all, f_all, o_all, g_all, lengths, dh_all, dc_all, dgates_out, drop_states,
                    dgates_all, dh0, dc0);
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
      .Arg<F32Buffer>()              // c0
      .Arg<F32Buffer>()              // w
      .Arg<F32Buffer>()              // b
      .Arg<ffi::Buffer<ffi::S32>>()  // lengths
      .Attr<float>("forget_bias")
      .Attr<int32_t>("drop_states");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(rnn2jax_lstm_forward, rnn2jax::Forward,
                              ForwardBinding()
                                  .Ret<F32Buffer>()    // h
                                  .Ret<F32Buffer>());  // c
XLA_FFI_DEFINE_HANDLER_SYMBOL(rnn2jax_lstm_forward_gates, rnn2jax::ForwardGates,
                              ForwardBinding()
                                  .Ret<F32Buffer>()    // h
                                  .Ret<F32Buffer>()    // c
                                  .Ret<F32Buffer>());  // the pre-activations [T, N, 4H]
XLA_FFI_DEFINE_HANDLER_SYMBOL(rnn2jax_lstm_forward_train, rnn2jax::ForwardTrain,
                              ForwardBinding()
                                  .Ret<F32Buffer>()    // h
                                  .Ret<F32Buffer>()    // c
                                  .Ret<F32Buffer>()    // i
                                  .Ret<F32Buffer>()    // f
                                  .Ret<F32Buffer>()    // o
                                  .Ret<F32Buffer>());  // g
XLA_FFI_DEFINE_HANDLER_SYMBOL(rnn2jax_lstm_backward, rnn2jax::Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<F32Buffer>()  // w
                                  .Arg<F32Buffer>()  // c0
                                  .Arg<F32Buffer>()  // c
                                  .Arg<F32Buffer>()  // i
                                  .Arg<F32Buffer>()  // f
                                  .Arg<F32Buffer>()  // o
                                  .Arg<F32Buffer>()  // g
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lengths
                                  .Arg<F32Buffer>()  // dh (empty: zero)
                                  .Arg<F32Buffer>()  // dc (empty: zero)
                                  .Arg<F32Buffer>()  // dgates_out (empty: zero)
                                  .Attr<int32_t>("drop_states")
                                  .Ret<F32Buffer>()  // dgates
                                  .Ret<F32Buffer>()  // dh0
                                  .Ret<F32Buffer>());  // dc0
#pragma GCC visibility pop
