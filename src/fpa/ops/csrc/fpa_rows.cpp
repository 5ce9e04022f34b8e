// Per-chunk driver: one query chunk of every row block, the GEMMs done by torch between calls
// (fpa.ops.chunked_attention's fused path). Row work in fpa_kernels.h.
#include "fpa_kernels.h"

// S, dP (BH, c, K); lse, delta (BH, Tq). One OpenMP region over the row blocks.
template <typename T, bool BWD, typename Args, typename Block>
static void rows_all(T* S, T* dP, T* lse, const T* delta, const Args& a, i64 BH, i64 Tq, i64 r0, i64 r1,
                     double scale, Block block) {
  const i64 cK = (r1 - r0) * (a.P + r1);
#pragma omp parallel
  {
    Scratch<T> sc;
#pragma omp for schedule(dynamic, 1)
    for (i64 bh = 0; bh < BH; ++bh)
      block(S + bh * cK, BWD ? dP + bh * cK : nullptr, lse + bh * Tq, BWD ? delta + bh * Tq : nullptr, a, bh, r0,
            r1, (T)scale, sc);
  }
}

#define FPA_ENTRY(NAME, T, BWD)                                                                         \
  extern "C" void NAME(void* S, void* dP, void* lse, const void* delta, const void* field,             \
                       const void* past_min, const void* level, const void* beta, i64 BH, i64 Hq,        \
                       i64 Tq, i64 P, i64 r0, i64 r1, double scale, int want, void* dvirt,                \
                       void* dlevel, double* dbeta, const void* hide) {                                 \
    FPA_ARGS(T);                                                                                        \
    rows_all<T, BWD>((T*)S, (T*)dP, (T*)lse, (const T*)delta, a, BH, Tq, r0, r1, scale, fpa_block<T, BWD>); \
  }
#define FOX_ENTRY(NAME, T, BWD)                                                                         \
  extern "C" void NAME(void* S, void* dP, void* lse, const void* delta, const void* cum, i64 BH,       \
                       i64 Tq, i64 P, i64 r0, i64 r1, double scale, int want, void* dcum) {             \
    FoxArgs<T> a{(const T*)cum, Tq, P, want, (T*)dcum};                                                 \
    rows_all<T, BWD>((T*)S, (T*)dP, (T*)lse, (const T*)delta, a, BH, Tq, r0, r1, scale, fox_block<T, BWD>); \
  }

FPA_ENTRY(fpa_fwd_f32, float, false)
FPA_ENTRY(fpa_bwd_f32, float, true)
FPA_ENTRY(fpa_fwd_f64, double, false)
FPA_ENTRY(fpa_bwd_f64, double, true)
FOX_ENTRY(fox_fwd_f32, float, false)
FOX_ENTRY(fox_bwd_f32, float, true)
FOX_ENTRY(fox_fwd_f64, double, false)
FOX_ENTRY(fox_bwd_f64, double, true)
