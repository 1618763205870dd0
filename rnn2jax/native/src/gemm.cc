// Caffe2's FC as one oneDNN GEMM (rnn2jax_gemm): the input projections of the recurrent nets, and their
// gradients, are the largest matmuls of a Caffe2 RNN, and oneDNN's sgemm runs them up to 1.5x faster than
// XLA's CPU dot on the shapes measured ([6400, 512] x [512, 2048]: 146 ms against 221 ms on one core).
//
//   in:  a [M, K] (or [K, M] with trans_a), b [K, N] (or [N, K] with trans_b), bias [N] (empty: none).
//   out: c [M, N] = op(a) op(b) + bias.
#include <cstdint>
#include <cstring>

#include "kernel_common.h"

namespace rnn2jax {
namespace {

using ffi::Buffer;
using ffi::F32;
using ffi::ResultBuffer;

ffi::Error gemm(ffi::ThreadPool pool, Buffer<F32> a, Buffer<F32> b, Buffer<F32> bias, int32_t trans_a,
                int32_t trans_b, ResultBuffer<F32> c) {
  const auto ad = a.dimensions(), bd = b.dimensions(), cd = c->dimensions();
  if (ad.size() != 2 || bd.size() != 2 || cd.size() != 2)
    return ffi::Error::InvalidArgument("rnn2jax_gemm: a, b and c must be matrices");
  const int64_t M = trans_a ? ad[1] : ad[0], K = trans_a ? ad[0] : ad[1];
  const int64_t N = trans_b ? bd[0] : bd[1];
  if ((trans_b ? bd[1] : bd[0]) != K || cd[0] != M || cd[1] != N || (count(bias) != 0 && count(bias) != N))
    return ffi::Error::InvalidArgument("rnn2jax_gemm: inconsistent shapes");
  const XlaThreads threads(pool, M * N * K);
  float* C = c->typed_data();
  float beta = 0.0f;
  if (count(bias) != 0) {
    const float* B = bias.typed_data();
    for (int64_t m = 0; m < M; ++m) std::memcpy(C + m * N, B, sizeof(float) * N);
    beta = 1.0f;
  }
  if (M == 0 || N == 0) return ffi::Error::Success();
  if (K == 0) {
    if (beta == 0.0f) std::memset(C, 0, sizeof(float) * M * N);
    return ffi::Error::Success();
  }
  sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, 1.0f, a.typed_data(), ad[1], b.typed_data(), bd[1], beta,
        C, N);
  return ffi::Error::Success();
}

ffi::Error Gemm(ffi::ThreadPool pool, Buffer<F32> a, Buffer<F32> b, Buffer<F32> bias, int32_t trans_a,
                int32_t trans_b, ResultBuffer<F32> c) {
  return guarded("rnn2jax_gemm", [&] { return gemm(pool, a, b, bias, trans_a, trans_b, c); });
}

}  // namespace
}  // namespace rnn2jax

namespace ffi = xla::ffi;

#pragma GCC visibility push(default)
XLA_FFI_DEFINE_HANDLER_SYMBOL(rnn2jax_gemm, rnn2jax::Gemm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // a
                                  .Arg<ffi::Buffer<ffi::F32>>()  // b
                                  .Arg<ffi::Buffer<ffi::F32>>()  // bias (empty: none)
                                  .Attr<int32_t>("trans_a")
                                  .Attr<int32_t>("trans_b")
                                  .Ret<ffi::Buffer<ffi::F32>>());  // c
#pragma GCC visibility pop
