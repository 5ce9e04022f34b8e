"""C++ source of the fused CPU kernels of the chunked engine (built by fpa.ops.cpu_kernels).

Kept as a Python string so that it ships with the package without package-data settings.

Per (row block bh = b * Hq + h, query chunk [r0, r1)), one pass per score row that stays in L1/L2:

  forward:  S (c, K) raw scores q.k  ->  normalized probabilities P (in place), lse
  backward: S, dP = dO.v (c, K)      ->  P and dS = P * (dP - delta) (in place), and the bias
            gradients (FPA: field/past_min via the argmin routing, level, beta; FoX: cum).

Columns past the causal limit are written as 0. FPA bias: beta * min(0, M(i, j) - level_j),
M = min of the field over (j, i] (FPA.md section 5): min(A_j, Pc_i) for keys before the chunk,
an incrementally updated local minimum inside it. FoX bias: cum_i - cum_j.

Two drivers. ``*_fwd/_bwd``: one chunk of every row block, the GEMMs done by torch between calls.
``*_whole_fwd/_bwd``: the whole op in one OpenMP region over (batch, kv head), every chunk's GEMMs
through MKL's sgemm_/dgemm_ (pointers handed over by set_gemm), so a chunk's scores stay in
cache and a busy machine costs one barrier, not hundreds. Each parallel unit owns its
accumulators (dk, dv of its kv head; the bias gradients of its rows), so there are no races.
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
// 0 for |x| below the smallest normal: a denormal dS would make the next GEMMs (dq, dk) slow
template <typename T>
static inline T flush(T x) {
  const T ax = x < 0 ? -x : x;
  return ax < std::numeric_limits<T>::min() ? T(0) : x;
}

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

template <typename T>

struct FpaArgs {  // FPA bias of row blocks bh = b * Hq + h
  const T *field, *past_min, *level, *beta;  // (BH, Tq), (BH, P), (BH, Tk), (Hq,)
  i64 Hq, Tq, P;
  int want;
  T *dvirt, *dlevel;  // (BH, Tq + P), (BH, Tk)
  double* dbeta;      // (BH,)
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
    for (i64 jl = 0; jl < i; ++jl) {  // local minima over (j, p]
      if (x <= Ml[jl]) { Ml[jl] = x; Mls[jl] = r; }
    }
    Ml[i] = INF;
    Mls[i] = r;
    T* row = S + i * K;
    if (!BWD) {
#pragma GCC ivdep  // the arrays are disjoint: no alias checks (more than 10 stop the vectorizer)
      for (i64 j = 0; j < nb; ++j) {
        const T mm = A[j] < pc ? A[j] : pc;
        const T d = mm - lv[j];
        row[j] = row[j] * scale + b * (d < 0 ? d : T(0));
      }
#pragma GCC ivdep  // the arrays are disjoint: no alias checks (more than 10 stop the vectorizer)
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
#pragma GCC ivdep  // the arrays are disjoint: no alias checks (more than 10 stop the vectorizer)
      for (i64 j = 0; j < nb; ++j) {
        const T mm = A[j] < pc ? A[j] : pc;
        const T d = mm - lv[j];
        const T pr = fexp(row[j] * scale + b * (d < 0 ? d : T(0)) - L);
        row[j] = pr;
        drow[j] = flush(pr * (drow[j] - dl));
      }
#pragma GCC ivdep  // the arrays are disjoint: no alias checks (more than 10 stop the vectorizer)
      for (i64 jl = 0; jl <= i; ++jl) {
        const T d = Ml[jl] - lvl[jl];
        const T pr = fexp(row[nb + jl] * scale + b * (d < 0 ? d : T(0)) - L);
        row[nb + jl] = pr;
        drow[nb + jl] = flush(pr * (drow[nb + jl] - dl));
      }
    } else {
      T dpc = 0, dbrow = 0;
      {
        T* rw = row;
        T* dr = drow;
        T* dlw = dlv;
        T* dAw = dA;
        const T* Aw = A;
        const T* lw = lv;
#pragma GCC ivdep  // the arrays are disjoint: no alias checks (more than 10 stop the vectorizer)
        for (i64 j = 0; j < nb; ++j) {
          const T aj = Aw[j];
          const T mm = aj < pc ? aj : pc;
          const T d = mm - lw[j];
          const T nd = d < 0 ? d : T(0);
          const T pr = fexp(rw[j] * scale + b * nd - L);
          const T ds = flush(pr * (dr[j] - dl));
          rw[j] = pr;
          dr[j] = ds;
          dbrow += ds * nd;
          const T g = d < 0 ? ds * b : T(0);
          dlw[j] -= g;
          const T ga = aj < pc ? g : T(0);
          dAw[j] += ga;
          dpc += g - ga;
        }
      }
      {
        T* rw = row + nb;
        T* dr = drow + nb;
        T* dlw = dlv + nb;
        T* gw = gl;
        const T* Mw = Ml;
        const T* lw = lvl;
#pragma GCC ivdep  // the arrays are disjoint: no alias checks (more than 10 stop the vectorizer)
        for (i64 jl = 0; jl <= i; ++jl) {
          const T d = Mw[jl] - lw[jl];
          const T nd = d < 0 ? d : T(0);
          const T pr = fexp(rw[jl] * scale + b * nd - L);
          const T ds = flush(pr * (dr[jl] - dl));
          rw[jl] = pr;
          dr[jl] = ds;
          dbrow += ds * nd;
          const T g = d < 0 ? ds * b : T(0);
          dlw[jl] -= g;
          gw[jl] = g;
        }
      }
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
#pragma GCC ivdep  // the arrays are disjoint: no alias checks (more than 10 stop the vectorizer)
      for (i64 j = 0; j <= p; ++j) row[j] = row[j] * scale + (cp - cm[j]);
      lse[r] = softmax_row(row, p + 1, K);
      continue;
    }
    T* drow = dP + i * K;
    const T L = lse[r], dl = delta[r];
    if (!dc) {
#pragma GCC ivdep  // the arrays are disjoint: no alias checks (more than 10 stop the vectorizer)
      for (i64 j = 0; j <= p; ++j) {
        const T pr = fexp(row[j] * scale + (cp - cm[j]) - L);
        row[j] = pr;
        drow[j] = flush(pr * (drow[j] - dl));
      }
    } else {
      T acc = 0;
#pragma GCC ivdep  // the arrays are disjoint: no alias checks (more than 10 stop the vectorizer)
      for (i64 j = 0; j <= p; ++j) {
        const T pr = fexp(row[j] * scale + (cp - cm[j]) - L);
        const T ds = flush(pr * (drow[j] - dl));
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

// One chunk of every row block (GEMMs done by torch): S, dP (BH, c, K); lse, delta (BH, Tq).

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
"""
