// What every rnn2jax CPU kernel shares: oneDNN's row-major sgemm, the thread count XLA gives the call,
// and the per-row loop that runs on those threads.
#pragma once
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

#include "oneapi/dnnl/dnnl.h"
#include "xla/ffi/api/ffi.h"

namespace rnn2jax {

namespace ffi = xla::ffi;

// C = alpha * op(A) op(B) + beta * C, row-major (oneDNN's dnnl_sgemm convention). oneDNN picks the ISA
// (AVX2, AVX-512, AMX) at run time; only the gate loops are compiled for the baseline ISA.
inline void sgemm(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  dnnl_sgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// The kernel uses the threads of XLA's intra-op pool for this executable (one when XLA runs single-threaded),
// through oneDNN's OpenMP team; the setting is per calling thread, so concurrent calls do not interfere.
inline void use_xla_threads(ffi::ThreadPool& pool) {
  const int64_t threads = pool.num_threads();
  if (threads > 0) omp_set_num_threads(static_cast<int>(threads));
}

// A buffer's element count, signed like the dimensions it is compared with.
template <typename B>
int64_t count(const B& buffer) {
  return static_cast<int64_t>(buffer.element_count());
}

// Rows are split over the threads only when a step has enough work to pay for the fork.
inline bool parallel_rows(int64_t rows, int64_t width) { return rows > 1 && rows * width >= 8192; }

// A failure inside a kernel becomes an XLA error (which rnn2jax reports), never an exception across the C ABI.
template <typename F>
ffi::Error guarded(const char* kernel, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string(kernel) + ": " + e.what());
  }
}

}  // namespace rnn2jax
