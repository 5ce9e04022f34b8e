// Fused CPU kernels of the chunked engine: the per-row work shared by both drivers
// (fpa_rows.cpp: one query chunk between torch's GEMMs; fpa_whole.cpp: the whole op).
// Built and loaded by fpa.ops.cpu_kernels (plain C++, no torch headers; called through ctypes).
//
// Per (row block bh = b * Hq + h, query chunk [r0, r1)), one pass per score row that stays in L1/L2:
//
//   forward:  S (c, K) raw scores q.k  ->  normalized probabilities P (in place), lse
//   backward: S, dP = dO.v (c, K)      ->  P and dS = P * (dP - delta) (in place), and the bias
//             gradients (FPA: field/past_min via the argmin routing, level, beta; FoX: cum).
//
// Columns past the causal limit are written as 0. FPA bias: beta * min(0, M(i, j) - level_j),
// M = min of the field over (j, i] (docs/fpa.md, "Computing it fast"): min(A_j, Pc_i) for keys before the chunk,
// an incrementally updated local minimum inside it. FoX bias: cum_i - cum_j.
//
// Numerics: built without -ffast-math, so the compiler keeps every rounding the source writes. Sums
// run in LANES interleaved partial sums (element j into lane j % LANES) added up in a fixed order at
// the end: that order is the source's, not the vector width's, so the result is the same whatever
// SIMD the compiler targets, and the loops still vectorize (lane l of a vector is partial sum l).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>
typedef int64_t i64;

static inline float fexp(float x) {
  // Cephes expf (about 1 ulp on [-87.3, 88]); exactly 0 below -87.3 (softmax tails).
  const float lo = -87.3365447504f, hi = 88.0f;
  const float xc = x < lo ? lo : (x > hi ? hi : x);
  // n = round(xc / ln 2): adding and removing 1.5 * 2^23 rounds to the nearest integer (kept as
  // written without -ffast-math; unlike floorf it vectorizes on every SIMD baseline).
  const float big = 12582912.0f;
  const float n = (xc * 1.44269504088896341f + big) - big;
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.0f;
  // 2^n for n in [-126, 127]; 0 below lo, so that the tail's product is an exact 0 (not a denormal:
  // those cost a microcode assist per lane on many CPUs)
  const int32_t e = x < lo ? 0 : ((int32_t)n + 127) << 23;
  float s;
  std::memcpy(&s, &e, sizeof s);
  return p * s;
}

static inline double fexp(double x) { return std::exp(x); }

// 0 for |x| below the smallest normal: a denormal dS would make the next GEMMs (dq, dk) slow
template <typename T>
static inline T flush(T x) {
  const T ax = x < 0 ? -x : x;
  return ax < std::numeric_limits<T>::min() ? T(0) : x;
}

// max of x[0:n] in 16 lanes (exact whatever the order; inf and -inf kept)
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

constexpr int LANES = 8;

template <typename T>
static inline T lane_total(const T* s) {
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

// row[j] = exp(row[j] - mx) for j < n; returns their sum (in lanes).
template <typename T>
static inline T exp_sum(T* __restrict row, i64 n, T mx) {
  T s[LANES] = {};
  i64 j = 0;
  for (; j + LANES <= n; j += LANES)
#pragma omp simd
    for (int l = 0; l < LANES; ++l) {
      const T e = fexp(row[j + l] - mx);
      row[j + l] = e;
      s[l] += e;
    }
  for (; j < n; ++j) {
    const T e = fexp(row[j] - mx);
    row[j] = e;
    s[j % LANES] += e;
  }
  return lane_total(s);
}

// Softmax of a forward row whose first n = p + 1 entries hold the biased scores; zeros after them.
template <typename T>
static inline T softmax_row(T* row, i64 n, i64 K) {
  const T mx = row_max(row, n);
  const T sum = exp_sum(row, n, mx);
  const T inv = T(1) / sum, tiny = std::numeric_limits<T>::min();
#pragma omp simd
  for (i64 j = 0; j < n; ++j) {  // flush would-be denormals: they make the next GEMM (P v) slow
    const T pj = row[j] * inv;
    row[j] = pj < tiny ? T(0) : pj;
  }
  for (i64 j = n; j < K; ++j) row[j] = 0;
  return mx + std::log(sum);
}

// Backward of FPA keys before the chunk, with the bias gradients: P and dS in place (row, drow),
// dlevel -= g, dA += the part of g routed to A_j; returns sum(dS * min(0, d)) and adds the part of g
// routed to Pc to *dpc.
template <typename T>
static inline T fpa_bwd_before(T* __restrict row, T* __restrict drow, T* __restrict dlv, T* __restrict dA,
                               const T* __restrict A, const T* __restrict lv, i64 n, T pc, T b, T scale, T L, T dl,
                               T* dpc) {
  T db[LANES] = {}, dp[LANES] = {};
  auto step = [&](i64 j, int l) {
    const T aj = A[j];
    const T mm = aj < pc ? aj : pc;
    const T d = mm - lv[j];
    const T nd = d < 0 ? d : T(0);
    const T pr = fexp(row[j] * scale + b * nd - L);
    const T ds = flush(pr * (drow[j] - dl));
    row[j] = pr;
    drow[j] = ds;
    db[l] += ds * nd;
    const T g = d < 0 ? ds * b : T(0);
    dlv[j] -= g;
    const T ga = aj < pc ? g : T(0);
    dA[j] += ga;
    dp[l] += g - ga;
  };
  i64 j = 0;
  for (; j + LANES <= n; j += LANES)
#pragma omp simd
    for (int l = 0; l < LANES; ++l) step(j + l, l);
  for (; j < n; ++j) step(j, int(j % LANES));
  *dpc += lane_total(dp);
  return lane_total(db);
}

// Backward of FPA keys inside the chunk (local minima Ml), with the bias gradients: like
// fpa_bwd_before, g stored in gl for the routing to the minima's positions.
template <typename T>
static inline T fpa_bwd_local(T* __restrict row, T* __restrict drow, T* __restrict dlv, T* __restrict gl,
                              const T* __restrict Ml, const T* __restrict lv, i64 n, T b, T scale, T L, T dl) {
  T db[LANES] = {};
  auto step = [&](i64 j, int l) {
    const T d = Ml[j] - lv[j];
    const T nd = d < 0 ? d : T(0);
    const T pr = fexp(row[j] * scale + b * nd - L);
    const T ds = flush(pr * (drow[j] - dl));
    row[j] = pr;
    drow[j] = ds;
    db[l] += ds * nd;
    const T g = d < 0 ? ds * b : T(0);
    dlv[j] -= g;
    gl[j] = g;
  };
  i64 j = 0;
  for (; j + LANES <= n; j += LANES)
#pragma omp simd
    for (int l = 0; l < LANES; ++l) step(j + l, l);
  for (; j < n; ++j) step(j, int(j % LANES));
  return lane_total(db);
}

// Backward of a FoX row with the gradient of cum: P and dS in place, dcum[j] -= dS_j; returns sum(dS).
template <typename T>
static inline T fox_bwd_grad(T* __restrict row, T* __restrict drow, T* __restrict dc, const T* __restrict cm, i64 n,
                             T cp, T scale, T L, T dl) {
  T acc[LANES] = {};
  auto step = [&](i64 j, int l) {
    const T pr = fexp(row[j] * scale + (cp - cm[j]) - L);
    const T ds = flush(pr * (drow[j] - dl));
    row[j] = pr;
    drow[j] = ds;
    dc[j] -= ds;
    acc[l] += ds;
  };
  i64 j = 0;
  for (; j + LANES <= n; j += LANES)
#pragma omp simd
    for (int l = 0; l < LANES; ++l) step(j + l, l);
  for (; j < n; ++j) step(j, int(j % LANES));
  return lane_total(acc);
}

template <typename T>
struct FpaArgs {  // FPA bias of row blocks bh = b * Hq + h
  const T *field, *past_min, *level, *beta;  // (BH, Tq), (BH, P), (BH, Tk), (Hq,)
  i64 Hq, Tq, P;
  int want;
  T *dvirt, *dlevel;  // (BH, Tq + P), (BH, Tk)
  double* dbeta;      // (BH,)
  const i64* hide;    // (BH, Tk) or null: key j is hidden from every query at position >= hide[j]
};

template <typename T>
struct FoxArgs {  // FoX bias: cum (BH, Tk); dcum likewise
  const T* cum;
  i64 Tq, P;
  int want;
  T* dcum;
};

template <typename T>
struct Scratch {
  std::vector<T> A, Ml, dA, gl, S, dP;
  std::vector<i64> As, Mls;
};

// One row block bh, query chunk [r0, r1): S (c, K) raw q.k -> P (forward, lse written), or
// S, dP -> P, dS with the bias gradients (backward). lse, delta: this block's (Tq,) rows.
template <typename T, bool BWD>
static void fpa_block(T* S, T* dP, T* lse, const T* delta, const FpaArgs<T>& a, i64 bh, i64 r0, i64 r1,
                      T scale, Scratch<T>& sc) {
  const i64 Tq = a.Tq, P = a.P, c = r1 - r0, K = P + r1, nb = P + r0, Tk = P + Tq;
  const T INF = std::numeric_limits<T>::infinity();
  sc.A.resize(nb + 1); sc.dA.resize(nb + 1); sc.As.resize(nb + 1);
  sc.Ml.resize(c + 1); sc.gl.resize(c + 1); sc.Mls.resize(c + 1);
  T *A = sc.A.data(), *dA = sc.dA.data(), *Ml = sc.Ml.data(), *gl = sc.gl.data();
  i64 *As = sc.As.data(), *Mls = sc.Mls.data();
  const T* f = a.field + bh * Tq;
  const T* pm = a.past_min + bh * P;
  const T* lv = a.level + bh * Tk;
  const T b = a.beta[bh % a.Hq];
  const i64* hid = a.hide ? a.hide + bh * Tk : nullptr;
  const int want = BWD && a.want;
  T* dlv = want ? a.dlevel + bh * Tk : nullptr;
  T* dvt = want ? a.dvirt + bh * (Tq + P) : nullptr;
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
  if (want)
    for (i64 j = 0; j < nb; ++j) dA[j] = 0;
  T pc = INF;  // min of the field over [r0, r]
  i64 pcs = 0;
  double dbacc = 0;
  const T* lvl = lv + nb;
  for (i64 i = 0; i < c; ++i) {
    const i64 r = r0 + i, p = P + r;
    const T x = f[r];
    if (x <= pc) { pc = x; pcs = r; }
#pragma omp simd
    for (i64 jl = 0; jl < i; ++jl) {  // local minima over (j, p]; ties: the latest position
      const bool take = x <= Ml[jl];
      Ml[jl] = take ? x : Ml[jl];
      Mls[jl] = take ? r : Mls[jl];
    }
    Ml[i] = INF;
    Mls[i] = r;
    T* row = S + i * K;
    if (hid)  // a hidden key's raw score is -inf: probability 0 and dS 0, so no gradient either
      for (i64 j = 0; j < p; ++j)
        if (p >= hid[j]) row[j] = -INF;
    if (!BWD) {
#pragma omp simd
      for (i64 j = 0; j < nb; ++j) {
        const T mm = A[j] < pc ? A[j] : pc;
        const T d = mm - lv[j];
        row[j] = row[j] * scale + b * (d < 0 ? d : T(0));
      }
#pragma omp simd
      for (i64 jl = 0; jl <= i; ++jl) {
        const T d = Ml[jl] - lvl[jl];
        row[nb + jl] = row[nb + jl] * scale + b * (d < 0 ? d : T(0));
      }
      lse[r] = softmax_row(row, p + 1, K);
      continue;
    }
    T* drow = dP + i * K;
    const T L = lse[r], dl = delta[r];
    if (!want) {
#pragma omp simd
      for (i64 j = 0; j < nb; ++j) {
        const T mm = A[j] < pc ? A[j] : pc;
        const T d = mm - lv[j];
        const T pr = fexp(row[j] * scale + b * (d < 0 ? d : T(0)) - L);
        row[j] = pr;
        drow[j] = flush(pr * (drow[j] - dl));
      }
#pragma omp simd
      for (i64 jl = 0; jl <= i; ++jl) {
        const T d = Ml[jl] - lvl[jl];
        const T pr = fexp(row[nb + jl] * scale + b * (d < 0 ? d : T(0)) - L);
        row[nb + jl] = pr;
        drow[nb + jl] = flush(pr * (drow[nb + jl] - dl));
      }
    } else {
      T dpc = 0;
      T dbrow = fpa_bwd_before(row, drow, dlv, dA, A, lv, nb, pc, b, scale, L, dl, &dpc);
      dbrow += fpa_bwd_local(row + nb, drow + nb, dlv + nb, gl, Ml, lvl, i + 1, b, scale, L, dl);
      for (i64 jl = 0; jl < i; ++jl)
        if (gl[jl] != 0) dvt[Mls[jl]] += gl[jl];
      dvt[pcs] += dpc;
      dbacc += dbrow;
    }
    for (i64 j = p + 1; j < K; ++j) { row[j] = 0; drow[j] = 0; }
  }
  if (want) {
    for (i64 j = 0; j < nb; ++j)
      if (dA[j] != 0) dvt[As[j]] += dA[j];
    a.dbeta[bh] += dbacc;
  }
}

template <typename T, bool BWD>
static void fox_block(T* S, T* dP, T* lse, const T* delta, const FoxArgs<T>& a, i64 bh, i64 r0, i64 r1,
                      T scale, Scratch<T>&) {
  const i64 P = a.P, c = r1 - r0, K = P + r1, Tk = P + a.Tq;
  const T* cm = a.cum + bh * Tk;
  T* dc = BWD && a.want ? a.dcum + bh * Tk : nullptr;
  for (i64 i = 0; i < c; ++i) {
    const i64 r = r0 + i, p = P + r;
    const T cp = cm[p];
    T* row = S + i * K;
    if (!BWD) {
#pragma omp simd
      for (i64 j = 0; j <= p; ++j) row[j] = row[j] * scale + (cp - cm[j]);
      lse[r] = softmax_row(row, p + 1, K);
      continue;
    }
    T* drow = dP + i * K;
    const T L = lse[r], dl = delta[r];
    if (!dc) {
#pragma omp simd
      for (i64 j = 0; j <= p; ++j) {
        const T pr = fexp(row[j] * scale + (cp - cm[j]) - L);
        row[j] = pr;
        drow[j] = flush(pr * (drow[j] - dl));
      }
    } else {
      const T acc = fox_bwd_grad(row, drow, dc, cm, p + 1, cp, scale, L, dl);
      dc[p] += acc;
    }
    for (i64 j = p + 1; j < K; ++j) { row[j] = 0; drow[j] = 0; }
  }
}

#define FPA_ARGS(T)                                                                                          \
  FpaArgs<T> a{(const T*)field, (const T*)past_min, (const T*)level, (const T*)beta, Hq, Tq, P, want, (T*)dvirt, \
               (T*)dlevel, dbeta, (const i64*)hide}
