// What every rnn2jax CPU kernel shares: oneDNN's row-major sgemm, the thread count XLA gives the call,
// and the per-row loop that runs on those threads.
#pragma once
#include <omp.h>

#include <algorithm>
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

// The kernel uses the threads of XLA's intra-op pool for this executable, through oneDNN's OpenMP team, but
// never more than OpenMP allows the calling thread (OMP_NUM_THREADS=1 runs them on one thread), and only when
// a step has the work to pay for waking them: below about four million multiply-adds a step (measured: (T, N, H) = (200, 16, 128)
// ran 1.2x slower on two threads than on one), one thread. OpenMP's thread count is a setting of the calling
// thread that other libraries in the process share (PyTorch's and NumPy's OpenMP builds read the same libgomp
// setting): a kernel sets it for its own call only and puts the caller's back when it returns.
inline constexpr int64_t kParallelStepMacs = int64_t{1} << 22;

class XlaThreads {
 public:
  explicit XlaThreads(ffi::ThreadPool& pool, int64_t macs_per_step = kParallelStepMacs)
      : callers_(omp_get_max_threads()) {
    const int64_t threads = macs_per_step >= kParallelStepMacs ? std::min<int64_t>(pool.num_threads(), callers_) : 1;
    omp_set_num_threads(static_cast<int>(threads > 0 ? threads : 1));
  }
  ~XlaThreads() { omp_set_num_threads(callers_); }
  XlaThreads(const XlaThreads&) = delete;
  XlaThreads& operator=(const XlaThreads&) = delete;

 private:
  int callers_;
};

// A buffer's element count, signed like the dimensions it is compared with.
template <typename B>
int64_t count(const B& buffer) {
  return static_cast<int64_t>(buffer.element_count());
}

// The gate loops split their rows over the same threads, where there are rows enough.
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
