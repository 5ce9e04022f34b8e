// Whole-op driver: the whole op in one OpenMP region over (batch, kv head), every chunk's GEMMs
// through the BLAS sgemm_/dgemm_ (Fortran interface, 32-bit integers) whose addresses
// fpa.ops.cpu_kernels hands over with set_gemm, so a chunk's scores stay in cache and a busy machine
// costs one barrier, not hundreds. Each parallel unit owns its accumulators (dk, dv of its kv head;
// the bias gradients of its rows), so there are no races. Row work in fpa_kernels.h.
#include "fpa_kernels.h"

typedef void (*sgemm_t)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                        const int*, const float*, const int*, const float*, float*, const int*);
typedef void (*dgemm_t)(const char*, const char*, const int*, const int*, const int*, const double*, const double*,
                        const int*, const double*, const int*, const double*, double*, const int*);
typedef int (*threads_local_t)(int);
static sgemm_t g_sgemm = nullptr;
static dgemm_t g_dgemm = nullptr;
static threads_local_t g_threads_local = nullptr;  // MKL_Set_Num_Threads_Local when the BLAS is MKL

extern "C" void set_gemm(void* s, void* d, void* tl) {
  g_sgemm = (sgemm_t)s; g_dgemm = (dgemm_t)d; g_threads_local = (threads_local_t)tl;
}

// Row-major C (M, N) = alpha op(A) op(B) + beta C; lda/ldb/ldc are row strides.
static void gemm(char ta, char tb, i64 M, i64 N, i64 K, float alpha, const float* A, i64 lda, const float* B,
                 i64 ldb, float beta, float* C, i64 ldc) {
  int m = (int)M, n = (int)N, k = (int)K, la = (int)lda, lb = (int)ldb, lc = (int)ldc;
  g_sgemm(&tb, &ta, &n, &m, &k, &alpha, B, &lb, A, &la, &beta, C, &lc);
}

static void gemm(char ta, char tb, i64 M, i64 N, i64 K, double alpha, const double* A, i64 lda, const double* B,
                 i64 ldb, double beta, double* C, i64 ldc) {
  int m = (int)M, n = (int)N, k = (int)K, la = (int)lda, lb = (int)ldb, lc = (int)ldc;
  g_dgemm(&tb, &ta, &n, &m, &k, &alpha, B, &lb, A, &la, &beta, C, &lc);
}

// q (B*Hkv, G, Tq, D), k (B*Hkv, Tk, D), v (B*Hkv, Tk, Dv), out / dout (B*Hkv, G, Tq, Dv), all contiguous;
// lse, delta (B*Hkv*G, Tq). Backward: dq like q, dk like k, dv like v (zeroed by the caller).
template <typename T, bool BWD, typename Args, typename Block>
static void whole(const T* q, const T* k, const T* v, T* out, const T* dout, T* lse, const T* delta, T* dq, T* dk,
                  T* dv, const Args& a, i64 BKV, i64 G, i64 Tq, i64 D, i64 Dv, i64 chunk, double scale_d, Block block) {
  const i64 P = a.P, Tk = P + Tq;
  const T scale = (T)scale_d;
#pragma omp parallel
  {
    const int prev = g_threads_local ? g_threads_local(1) : 0;  // one GEMM thread inside this region
    Scratch<T> sc;
    sc.S.resize(chunk * Tk);
    if (BWD) sc.dP.resize(chunk * Tk);
#pragma omp for schedule(dynamic, 1)
    for (i64 bk = 0; bk < BKV; ++bk) {
      const T* kp = k + bk * Tk * D;
      const T* vp = v + bk * Tk * Dv;
      for (i64 g = 0; g < G; ++g) {
        const i64 bh = bk * G + g;
        const T* qh = q + bh * Tq * D;
        for (i64 r0 = 0; r0 < Tq; r0 += chunk) {
          const i64 r1 = r0 + chunk < Tq ? r0 + chunk : Tq, c = r1 - r0, K = P + r1;
          T* S = sc.S.data();
          const T* qc = qh + r0 * D;
          gemm('N', 'T', c, K, D, T(1), qc, D, kp, D, T(0), S, K);
          if (!BWD) {
            block(S, nullptr, lse + bh * Tq, nullptr, a, bh, r0, r1, scale, sc);
            gemm('N', 'N', c, Dv, K, T(1), S, K, vp, Dv, T(0), out + (bh * Tq + r0) * Dv, Dv);
            continue;
          }
          T* dPb = sc.dP.data();
          const T* doc = dout + (bh * Tq + r0) * Dv;
          gemm('N', 'T', c, K, Dv, T(1), doc, Dv, vp, Dv, T(0), dPb, K);
          block(S, dPb, lse + bh * Tq, delta + bh * Tq, a, bh, r0, r1, scale, sc);
          gemm('T', 'N', K, Dv, c, T(1), S, K, doc, Dv, T(1), dv + bk * Tk * Dv, Dv);
          gemm('N', 'N', c, D, K, scale, dPb, K, kp, D, T(0), dq + (bh * Tq + r0) * D, D);
          gemm('T', 'N', K, D, c, scale, dPb, K, qc, D, T(1), dk + bk * Tk * D, D);
        }
      }
    }
    if (g_threads_local) g_threads_local(prev);
  }
}

#define WHOLE_PARAMS                                                                                      \
  const void *q, const void *k, const void *v, void *out, const void *dout, void *lse, const void *delta,   \
      void *dq, void *dk, void *dv, i64 BKV, i64 G, i64 Tq, i64 D, i64 Dv, i64 chunk, double scale
#define WHOLE_CALL(T, BWD, BLOCK)                                                                         \
  whole<T, BWD>((const T*)q, (const T*)k, (const T*)v, (T*)out, (const T*)dout, (T*)lse, (const T*)delta,   \
                (T*)dq, (T*)dk, (T*)dv, a, BKV, G, Tq, D, Dv, chunk, scale, BLOCK<T, BWD>)
#define FPA_WHOLE(NAME, T, BWD)                                                                           \
  extern "C" void NAME(WHOLE_PARAMS, const void* field, const void* past_min, const void* level,         \
                       const void* beta, i64 Hq, i64 P, int want, void* dvirt, void* dlevel, double* dbeta, \
                       const void* hide) {                                                               \
    FPA_ARGS(T);                                                                                          \
    WHOLE_CALL(T, BWD, fpa_block);                                                                        \
  }
#define FOX_WHOLE(NAME, T, BWD)                                                                           \
  extern "C" void NAME(WHOLE_PARAMS, const void* cum, i64 P, int want, void* dcum) {                     \
    FoxArgs<T> a{(const T*)cum, Tq, P, want, (T*)dcum};                                                   \
    WHOLE_CALL(T, BWD, fox_block);                                                                        \
  }

FPA_WHOLE(fpa_whole_fwd_f32, float, false)
FPA_WHOLE(fpa_whole_bwd_f32, float, true)
FPA_WHOLE(fpa_whole_fwd_f64, double, false)
FPA_WHOLE(fpa_whole_bwd_f64, double, true)
FOX_WHOLE(fox_whole_fwd_f32, float, false)
FOX_WHOLE(fox_whole_bwd_f32, float, true)
FOX_WHOLE(fox_whole_bwd_f64, double, true)
FOX_WHOLE(fox_whole_fwd_f64, double, false)
