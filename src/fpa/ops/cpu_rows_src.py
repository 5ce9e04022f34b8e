"""C++ source of the fused row kernels of the chunked CPU engine (built by fpa.ops.cpu_kernels).

Kept as a Python string so that it ships with the package without package-data settings.

One call handles one query chunk [r0, r1) of every (batch, query head) row block bh. The GEMMs
(q k^T, P v, ...) stay in torch (MKL/oneDNN); these kernels do everything elementwise between them,
in one pass per score row that stays in L1/L2:

  forward:  S (BH, c, K) raw scores q.k  ->  normalized probabilities P (in place), lse (BH, Tq)
  backward: S, dP = dO.v (BH, c, K)     ->  P and dS = P * (dP - delta) (in place), and the
            bias gradients (FPA: field/past_min via the argmin routing, level, beta; FoX: cum).

Columns past the causal limit are written as 0. Row blocks bh = b * Hq + h run in parallel
(OpenMP, torch's runtime); each owns its accumulators, so there are no races.
FPA bias: beta * min(0, M(i, j) - level_j), M = min of the field over (j, i] (FPA.md section 5):
min(A_j, Pc_i) for keys before the chunk, an incrementally updated local minimum inside it.
FoX bias: cum_i - cum_j.
"""

SOURCE = r"""
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>
typedef int64_t i64;

static inline float fexp(float x) {
  // Cephes expf (about 1 ulp on [-87.3, 88]); exactly 0 below -87.3 (softmax tails).
  const float lo = -87.3365447504f, hi = 88.0f;
  float xc = x < lo ? lo : (x > hi ? hi : x);
  float n = __builtin_floorf(xc * 1.44269504088896341f + 0.5f);
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.0f;
  int32_t e = ((int32_t)n + 127) << 23;
  float s = __builtin_bit_cast(float, e);
  return x < lo ? 0.0f : p * s;
}
static inline double fexp(double x) { return std::exp(x); }

// Softmax tail of a forward row whose first n = p + 1 entries hold the biased scores.
// max of x[0:n] in 16 lanes (a plain max reduction does not vectorize without -ffinite-math-only)
template <typename T>
static inline T row_max(const T* x, i64 n) {
  const T NEG = -std::numeric_limits<T>::infinity();
  T m[16];
  for (int l = 0; l < 16; ++l) m[l] = NEG;
  i64 j = 0;
  for (; j + 16 <= n; j += 16)
    for (int l = 0; l < 16; ++l) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  T r = NEG;
  for (int l = 0; l < 16; ++l) r = m[l] > r ? m[l] : r;
  for (; j < n; ++j) r = x[j] > r ? x[j] : r;
  return r;
}

template <typename T>
static inline T softmax_row(T* row, i64 n, i64 K) {
  const T mx = row_max(row, n);
  T sum = 0;
  for (i64 j = 0; j < n; ++j) {
    T e = fexp(row[j] - mx);
    row[j] = e;
    sum += e;
  }
  const T inv = T(1) / sum, tiny = std::numeric_limits<T>::min();
  for (i64 j = 0; j < n; ++j) {  // flush would-be denormals: they make the next GEMM (P v) slow
    const T pj = row[j] * inv;
    row[j] = pj < tiny ? T(0) : pj;
  }
  for (i64 j = n; j < K; ++j) row[j] = 0;
  return mx + std::log(sum);
}

template <typename T, bool BWD>
static void fpa_chunk(T* S, T* dP, T* lse, const T* delta, const T* field, const T* past_min,
                      const T* level, const T* beta, i64 BH, i64 Hq, i64 Tq, i64 P, i64 r0, i64 r1,
                      double scale_d, int want, T* dvirt, T* dlevel, double* dbeta) {
  const i64 c = r1 - r0, K = P + r1, nb = P + r0, Tk = P + Tq;
  const T INF = std::numeric_limits<T>::infinity();
  const T scale = (T)scale_d;
#pragma omp parallel
  {
    std::vector<T> A(nb + 1), Ml(c + 1), dA(nb + 1), gl(c + 1);
    std::vector<i64> As(nb + 1), Mls(c + 1);
#pragma omp for schedule(dynamic, 1)
    for (i64 bh = 0; bh < BH; ++bh) {
      const T* f = field + bh * Tq;
      const T* pm = past_min + bh * P;
      const T* lv = level + bh * Tk;
      const T b = beta[bh % Hq];
      T* dlv = want ? dlevel + bh * Tk : nullptr;
      T* dvt = want ? dvirt + bh * (Tq + P) : nullptr;
      // A_j: min of the field over (j, nb - 1], past_min folded in; As: its index in [field | past_min].
      // Tie rules (stated in first_passage_attention's docstring): earliest position here, past_min
      // over the field, Pc over A, and the latest position for Pc and the local minima.
      T m = INF;
      i64 ms = 0;
      for (i64 j = nb - 1; j >= P; --j) {
        A[j] = m;
        As[j] = ms;
        const T x = f[j - P];
        if (x <= m) { m = x; ms = j - P; }  // ties: the earliest position
      }
      for (i64 j = 0; j < P; ++j) {
        const T x = pm[j];
        if (x <= m) { A[j] = x; As[j] = Tq + j; } else { A[j] = m; As[j] = ms; }
      }
      if (BWD && want)
        for (i64 j = 0; j < nb; ++j) dA[j] = 0;
      T pc = INF;  // min of the field over [r0, r]
      i64 pcs = 0;
      double dbacc = 0;
      const T* Ab = A.data();
      T* dAb = dA.data();
      T* Mlb = Ml.data();
      const T* lvl = lv + nb;
      for (i64 i = 0; i < c; ++i) {
        const i64 r = r0 + i, p = P + r;
        const T x = f[r];
        if (x <= pc) { pc = x; pcs = r; }
        for (i64 jl = 0; jl < i; ++jl) {  // local minima over (j, p]
          if (x <= Ml[jl]) { Ml[jl] = x; Mls[jl] = r; }
        }
        Ml[i] = INF;
        Mls[i] = r;
        T* row = S + (bh * c + i) * K;
        if (!BWD) {
          for (i64 j = 0; j < nb; ++j) {
            const T mm = Ab[j] < pc ? Ab[j] : pc;
            const T d = mm - lv[j];
            row[j] = row[j] * scale + b * (d < 0 ? d : T(0));
          }
          for (i64 jl = 0; jl <= i; ++jl) {
            const T d = Mlb[jl] - lvl[jl];
            row[nb + jl] = row[nb + jl] * scale + b * (d < 0 ? d : T(0));
          }
          lse[bh * Tq + r] = softmax_row(row, p + 1, K);
          continue;
        }
        T* drow = dP + (bh * c + i) * K;
        const T L = lse[bh * Tq + r], dl = delta[bh * Tq + r];
        if (!want) {
          for (i64 j = 0; j < nb; ++j) {
            const T mm = Ab[j] < pc ? Ab[j] : pc;
            const T d = mm - lv[j];
            const T pr = fexp(row[j] * scale + b * (d < 0 ? d : T(0)) - L);
            row[j] = pr;
            drow[j] = pr * (drow[j] - dl);
          }
          for (i64 jl = 0; jl <= i; ++jl) {
            const T d = Mlb[jl] - lvl[jl];
            const T pr = fexp(row[nb + jl] * scale + b * (d < 0 ? d : T(0)) - L);
            row[nb + jl] = pr;
            drow[nb + jl] = pr * (drow[nb + jl] - dl);
          }
        } else {
          T dpc = 0, dbrow = 0;
          for (i64 j = 0; j < nb; ++j) {
            const bool toA = Ab[j] < pc;
            const T mm = toA ? Ab[j] : pc;
            const T d = mm - lv[j];
            const T nd = d < 0 ? d : T(0);
            const T pr = fexp(row[j] * scale + b * nd - L);
            const T ds = pr * (drow[j] - dl);
            row[j] = pr;
            drow[j] = ds;
            dbrow += ds * nd;
            const T g = d < 0 ? ds * b : T(0);
            dlv[j] -= g;
            const T ga = toA ? g : T(0);
            dAb[j] += ga;
            dpc += g - ga;
          }
          T* glb = gl.data();
          T* dlvl = dlv + nb;
          for (i64 jl = 0; jl <= i; ++jl) {
            const T d = Mlb[jl] - lvl[jl];
            const T nd = d < 0 ? d : T(0);
            const T pr = fexp(row[nb + jl] * scale + b * nd - L);
            const T ds = pr * (drow[nb + jl] - dl);
            row[nb + jl] = pr;
            drow[nb + jl] = ds;
            dbrow += ds * nd;
            const T g = d < 0 ? ds * b : T(0);
            dlvl[jl] -= g;
            glb[jl] = g;
          }
          for (i64 jl = 0; jl < i; ++jl)
            if (glb[jl] != 0) dvt[Mls[jl]] += glb[jl];
          dvt[pcs] += dpc;
          dbacc += dbrow;
        }
        for (i64 j = p + 1; j < K; ++j) { row[j] = 0; drow[j] = 0; }
      }
      if (BWD && want) {
        for (i64 j = 0; j < nb; ++j)
          if (dA[j] != 0) dvt[As[j]] += dA[j];
        dbeta[bh] += dbacc;
      }
    }
  }
}

template <typename T, bool BWD>
static void fox_chunk(T* S, T* dP, T* lse, const T* delta, const T* cum, i64 BH, i64 Tq, i64 P,
                      i64 r0, i64 r1, double scale_d, int want, T* dcum) {
  const i64 c = r1 - r0, K = P + r1, Tk = P + Tq;
  const T scale = (T)scale_d;
#pragma omp parallel for schedule(dynamic, 1)
  for (i64 bh = 0; bh < BH; ++bh) {
    const T* cm = cum + bh * Tk;
    T* dc = want ? dcum + bh * Tk : nullptr;
    for (i64 i = 0; i < c; ++i) {
      const i64 r = r0 + i, p = P + r;
      const T cp = cm[p];
      T* row = S + (bh * c + i) * K;
      if (!BWD) {
        for (i64 j = 0; j <= p; ++j) row[j] = row[j] * scale + (cp - cm[j]);
        lse[bh * Tq + r] = softmax_row(row, p + 1, K);
        continue;
      }
      T* drow = dP + (bh * c + i) * K;
      const T L = lse[bh * Tq + r], dl = delta[bh * Tq + r];
      if (!want) {
        for (i64 j = 0; j <= p; ++j) {
          const T pr = fexp(row[j] * scale + (cp - cm[j]) - L);
          row[j] = pr;
          drow[j] = pr * (drow[j] - dl);
        }
      } else {
        T acc = 0;
        for (i64 j = 0; j <= p; ++j) {
          const T pr = fexp(row[j] * scale + (cp - cm[j]) - L);
          const T ds = pr * (drow[j] - dl);
          row[j] = pr;
          drow[j] = ds;
          dc[j] -= ds;
          acc += ds;
        }
        dc[p] += acc;
      }
      for (i64 j = p + 1; j < K; ++j) { row[j] = 0; drow[j] = 0; }
    }
  }
}

#define FPA_ENTRY(NAME, T, BWD)                                                                  \
  extern "C" void NAME(void* S, void* dP, void* lse, const void* delta, const void* field,      \
                       const void* past_min, const void* level, const void* beta, i64 BH, i64 Hq, \
                       i64 Tq, i64 P, i64 r0, i64 r1, double scale, int want, void* dvirt,         \
                       void* dlevel, double* dbeta) {                                            \
    fpa_chunk<T, BWD>((T*)S, (T*)dP, (T*)lse, (const T*)delta, (const T*)field,                 \
                      (const T*)past_min, (const T*)level, (const T*)beta, BH, Hq, Tq, P, r0, r1, \
                      scale, want, (T*)dvirt, (T*)dlevel, dbeta);                                \
  }
#define FOX_ENTRY(NAME, T, BWD)                                                                   \
  extern "C" void NAME(void* S, void* dP, void* lse, const void* delta, const void* cum, i64 BH, \
                       i64 Tq, i64 P, i64 r0, i64 r1, double scale, int want, void* dcum) {       \
    fox_chunk<T, BWD>((T*)S, (T*)dP, (T*)lse, (const T*)delta, (const T*)cum, BH, Tq, P, r0, r1, \
                      scale, want, (T*)dcum);                                                    \
  }
FPA_ENTRY(fpa_fwd_f32, float, false)
FPA_ENTRY(fpa_bwd_f32, float, true)
FPA_ENTRY(fpa_fwd_f64, double, false)
FPA_ENTRY(fpa_bwd_f64, double, true)
FOX_ENTRY(fox_fwd_f32, float, false)
FOX_ENTRY(fox_bwd_f32, float, true)
FOX_ENTRY(fox_fwd_f64, double, false)
FOX_ENTRY(fox_bwd_f64, double, true)
"""
