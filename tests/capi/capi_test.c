/* Tests of the C ABI (capi/muonrt.h), compiled as C: single-device
 * optimizers over matrices this program owns (fp32 and bf16), one step
 * against a float64 reference of torch.optim.Muon's step written here,
 * every argument error, the JSON buffer protocol, state and checkpoints,
 * and a process group of one rank from torchrun's environment.
 *
 * A plain C program: each test is a function; CHECK prints the failing
 * expression with muonrt_last_error() and ends the test; main runs them
 * all and exits 1 if any failed. */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "capi/muonrt.h"

static int g_failed = 0;
static int g_test_failed = 0;

#define CHECK(cond)                                                      \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n  last error: \"%s\"\n", \
              __FILE__, __LINE__, #cond, muonrt_last_error());           \
      g_test_failed = 1;                                                 \
      goto done;                                                         \
    }                                                                    \
  } while (0)

/* `expr` returns `code`; on mismatch prints both and the message. */
#define CHECK_CODE(expr, code)                                   \
  do {                                                           \
    int got_ = (expr);                                           \
    if (got_ != (code)) {                                        \
      fprintf(stderr,                                            \
              "%s:%d: %s returned %d, expected %d (%s)\n  last " \
              "error: \"%s\"\n",                                 \
              __FILE__, __LINE__, #expr, got_, (code), #code,    \
              muonrt_last_error());                              \
      g_test_failed = 1;                                         \
      goto done;                                                 \
    }                                                            \
  } while (0)

#define CHECK_OK(expr) CHECK_CODE(expr, MUONRT_OK)

/* The last error contains `text`. */
#define CHECK_ERROR_HAS(text)                                              \
  do {                                                                     \
    if (strstr(muonrt_last_error(), (text)) == NULL) {                     \
      fprintf(stderr, "%s:%d: last error \"%s\" lacks \"%s\"\n", __FILE__, \
              __LINE__, muonrt_last_error(), (text));                      \
      g_test_failed = 1;                                                   \
      goto done;                                                           \
    }                                                                      \
  } while (0)

/* ---- Helpers ---------------------------------------------------------- */

static uint16_t ToBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even (finite f) */
  return (uint16_t)(u >> 16);
}

static float FromBf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Deterministic values in about [-1, 1]. */
static float Value(int seed, int i) {
  return (float)sin(0.7 * seed + 0.37 * (i + 1) * (seed + 1));
}

static void Fill(float* x, int n, int seed) {
  for (int i = 0; i < n; ++i) x[i] = Value(seed, i);
}

/* A CPU fp32 row-major 2-D parameter. */
static muonrt_param Param2D(const char* name, void* data, const void* grad,
                            const int64_t* shape) {
  muonrt_param p;
  memset(&p, 0, sizeof(p));
  p.name = name;
  p.data = data;
  p.grad = grad;
  p.dtype = MUONRT_FLOAT32;
  p.grad_dtype = MUONRT_FLOAT32;
  p.ndim = 2;
  p.local_shape = shape;
  p.device_type = MUONRT_CPU;
  return p;
}

static const char* TempDir(void) {
  const char* t = getenv("TEST_TMPDIR");
  return t != NULL && *t != '\0' ? t : "/tmp";
}

/* A fresh directory under TempDir(), in `out` (>= 256 bytes). */
static int MakeDir(char* out, const char* prefix) {
  snprintf(out, 256, "%s/%s_XXXXXX", TempDir(), prefix);
  return mkdtemp(out) != NULL;
}

/* ---- A float64 reference of torch.optim.Muon's step (PyTorch 2.9,
 * torch/optim/_muon.py) for one 2-D parameter:
 *   buf.lerp_(grad, 1 - momentum)
 *   update = grad.lerp(buf, momentum) if nesterov else buf
 *   update = _zeropower_via_newtonschulz(update, (a, b, c), ns_steps, eps)
 *   param.mul_(1 - lr * weight_decay)
 *   param.add_(update, alpha=-_adjust_lr(lr, adjust_lr_fn, param.shape))
 * with _zeropower_via_newtonschulz computed in float64 instead of bf16:
 *   X = U (transposed when rows > cols); X /= max(||X||_F, eps)
 *   repeat ns_steps: A = X X^T; B = b A + c A A; X = a X + B X
 * and _adjust_lr: "original" lr * sqrt(max(1, rows / cols)),
 * "match_rms_adamw" lr * 0.2 * sqrt(max(rows, cols)). -------------------- */

enum { kRefMax = 64 };

typedef struct {
  double lr, weight_decay, momentum, a, b, c, eps;
  int nesterov, ns_steps, match_rms_adamw;
} RefOptions;

/* C (m x n) = A (m x k) * B (k x n), row-major. */
static void MatMul(const double* A, const double* B, double* C, int m, int k,
                   int n) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int t = 0; t < k; ++t) s += A[i * k + t] * B[t * n + j];
      C[i * n + j] = s;
    }
  }
}

/* O = NS(U) for U rows x cols (rows * cols <= kRefMax). */
static void NewtonSchulz(const double* U, int rows, int cols,
                         const RefOptions* o, double* O) {
  const int transposed = rows > cols;
  const int r = transposed ? cols : rows, c = transposed ? rows : cols;
  double X[kRefMax], Xt[kRefMax], A[kRefMax], AA[kRefMax], B[kRefMax],
      BX[kRefMax];
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      if (transposed) {
        X[j * c + i] = U[i * cols + j];
      } else {
        X[i * c + j] = U[i * cols + j];
      }
    }
  }
  double norm = 0;
  for (int i = 0; i < r * c; ++i) norm += X[i] * X[i];
  norm = sqrt(norm);
  if (norm < o->eps) norm = o->eps;
  for (int i = 0; i < r * c; ++i) X[i] /= norm;
  for (int step = 0; step < o->ns_steps; ++step) {
    for (int i = 0; i < r; ++i) {
      for (int j = 0; j < c; ++j) Xt[j * r + i] = X[i * c + j];
    }
    MatMul(X, Xt, A, r, c, r);
    MatMul(A, A, AA, r, r, r);
    for (int i = 0; i < r * r; ++i) B[i] = o->b * A[i] + o->c * AA[i];
    MatMul(B, X, BX, r, r, c);
    for (int i = 0; i < r * c; ++i) X[i] = o->a * X[i] + BX[i];
  }
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      O[i * cols + j] = transposed ? X[j * c + i] : X[i * c + j];
    }
  }
}

/* One step on W (rows x cols) with gradient G and momentum buffer Buf. */
static void ReferenceStep(double* W, const double* G, double* Buf, int rows,
                          int cols, const RefOptions* o) {
  const int n = rows * cols;
  double U[kRefMax], O[kRefMax];
  for (int i = 0; i < n; ++i) {
    Buf[i] += (1 - o->momentum) * (G[i] - Buf[i]);
    U[i] = o->nesterov ? G[i] + o->momentum * (Buf[i] - G[i]) : Buf[i];
  }
  NewtonSchulz(U, rows, cols, o, O);
  double ratio = (double)rows / cols;
  double adjusted = o->match_rms_adamw
                        ? o->lr * 0.2 * sqrt(rows > cols ? rows : cols)
                        : o->lr * sqrt(ratio > 1 ? ratio : 1);
  for (int i = 0; i < n; ++i) {
    W[i] *= 1 - o->lr * o->weight_decay;
    W[i] -= adjusted * O[i];
  }
}

/* ---- Tests ------------------------------------------------------------ */

static void AbiVersion_IsSeventeen(void) {
  CHECK(muonrt_abi_version() == MUONRT_ABI_VERSION);
  CHECK(MUONRT_ABI_VERSION == 18);
  CHECK(strcmp(muonrt_last_error(), "") == 0);
done:;
}

static void ComputeThreads_SetAndRefusedOutOfRange(void) {
  const int saved = muonrt_compute_threads();
  CHECK(saved >= 1);
  CHECK(muonrt_set_compute_threads(3) == MUONRT_OK);
  CHECK(muonrt_compute_threads() == 3);
  CHECK(muonrt_set_compute_threads(0) == MUONRT_INVALID_ARGUMENT);
  CHECK(strstr(muonrt_last_error(), "got 0") != NULL);
  CHECK(muonrt_compute_threads() == 3);
  CHECK(strstr(muonrt_cpu_kernels(), "OpenBLAS") != NULL);
  CHECK(muonrt_set_compute_threads(saved) == MUONRT_OK);
done:;
}

static void OptionsDefault_AreTorchDefaults(void) {
  muonrt_options o;
  memset(&o, 0xFF, sizeof(o));
  muonrt_options_default(&o);
  CHECK(o.lr == 1e-3);
  CHECK(o.weight_decay == 0.1);
  CHECK(o.momentum == 0.95);
  CHECK(o.nesterov == 1);
  CHECK(o.ns_a == 3.4445 && o.ns_b == -4.7750 && o.ns_c == 2.0315);
  CHECK(o.eps == 1e-7);
  CHECK(o.ns_steps == 5);
  CHECK(o.adjust_lr_fn == NULL && o.ns_schedule == NULL);
  CHECK(o.async_gpu_parallelism == 0 && o.prefetch_count == 0);
  CHECK(o.assignment_policy == NULL && o.bucket_size_bytes == 0);
  CHECK(o.transactional_step == 0);
  CHECK(o.replan_every_steps == 0);
  CHECK(o.ns_method == NULL);
  CHECK(o.overlap_backward == 0 && o.momentum_dtype == NULL);
  CHECK(o.check_finite == -1);    /* unset: muon::ResolveOptions decides */
  CHECK(o.gpu_precision == NULL); /* bf16 on CUDA parameters */
  muonrt_options_default(NULL);   /* no-op */
done:;
}

/* muonrt_options_validate: the defaults pass; torch's argument errors,
 * negative execution counts and options that cannot run together are
 * INVALID_ARGUMENT naming the field. */
static void OptionsValidate_NamesTheBadField(void) {
  muonrt_options o;
  muonrt_options_default(&o);
  CHECK(muonrt_options_validate(&o) == MUONRT_OK);
  o.lr = -0.5;
  CHECK(muonrt_options_validate(&o) == MUONRT_INVALID_ARGUMENT);
  CHECK(strstr(muonrt_last_error(),
               "Learning rate should be >= 0 but is: -0.5") != NULL);
  muonrt_options_default(&o);
  o.prefetch_count = -1;
  CHECK(muonrt_options_validate(&o) == MUONRT_INVALID_ARGUMENT);
  CHECK(strstr(muonrt_last_error(),
               "execution.prefetch_count is -1; must be >= 0") != NULL);
  muonrt_options_default(&o);
  o.assignment_policy = "fastest";
  CHECK(muonrt_options_validate(&o) == MUONRT_INVALID_ARGUMENT);
  CHECK(strstr(muonrt_last_error(), "\"fastest\"") != NULL);
  muonrt_options_default(&o);
  o.gpu_precision = "fp32";
  CHECK(muonrt_options_validate(&o) == MUONRT_OK);
  o.gpu_precision = "fp64";
  CHECK(muonrt_options_validate(&o) == MUONRT_INVALID_ARGUMENT);
  CHECK(strstr(muonrt_last_error(), "execution.gpu_precision \"fp64\"") !=
        NULL);
  /* check_finite: -1, 0 or 1; overlap_backward leaves it off when unset
   * and keeps it on when set (a snapshot undoes a bad step). */
  muonrt_options_default(&o);
  o.check_finite = 2;
  CHECK(muonrt_options_validate(&o) == MUONRT_INVALID_ARGUMENT);
  CHECK(strstr(muonrt_last_error(), "check_finite 2") != NULL);
  muonrt_options_default(&o);
  o.overlap_backward = 1;
  CHECK(muonrt_options_validate(&o) == MUONRT_OK);
  o.check_finite = 0;
  CHECK(muonrt_options_validate(&o) == MUONRT_OK);
  o.check_finite = 1;
  CHECK(muonrt_options_validate(&o) == MUONRT_OK);
  o.check_finite = -1;
  o.transactional_step = 1;
  CHECK(muonrt_options_validate(&o) == MUONRT_INVALID_ARGUMENT);
  CHECK(strstr(muonrt_last_error(), "transactional_step") != NULL);
  CHECK(muonrt_options_validate(NULL) == MUONRT_INVALID_ARGUMENT);
done:;
}

/* Two fp32 matrices and a bf16 one, owned here: a step writes them in
 * place (same memory), keeps the momentum pointers, counts the step. */
static void Step_Fp32AndBf16_UpdatesInPlace(void) {
  enum { kA = 4 * 3, kB = 3 * 5, kC = 4 * 4 };
  float a[kA], b[kB], ga[kA], gb[kB], a0[kA], b0[kB];
  uint16_t c[kC], gc[kC], c0[kC];
  const int64_t sa[2] = {4, 3}, sb[2] = {3, 5}, sc[2] = {4, 4};
  muonrt_optimizer* opt = NULL;
  Fill(a, kA, 1);
  Fill(b, kB, 2);
  Fill(ga, kA, 3);
  Fill(gb, kB, 4);
  for (int i = 0; i < kC; ++i) {
    c[i] = ToBf16(Value(5, i));
    gc[i] = ToBf16(Value(6, i));
  }
  memcpy(a0, a, sizeof(a));
  memcpy(b0, b, sizeof(b));
  memcpy(c0, c, sizeof(c));
  muonrt_param params[3];
  params[0] = Param2D("a.weight", a, ga, sa);
  params[1] = Param2D("b.weight", b, gb, sb);
  params[2] = Param2D("c.weight", c, gc, sc);
  params[2].dtype = MUONRT_BFLOAT16;
  params[2].grad_dtype = MUONRT_BFLOAT16;
  muonrt_options options;
  muonrt_options_default(&options);
  options.lr = 0.02;
  CHECK_OK(
      muonrt_optimizer_create(NULL, 0, NULL, NULL, params, 3, &options, &opt));
  CHECK(opt != NULL);
  CHECK(strcmp(muonrt_last_error(), "") == 0);
  CHECK(muonrt_optimizer_step_count(opt) == 0);
  const float* m0 = NULL;
  int64_t n0 = 0;
  CHECK_OK(muonrt_optimizer_momentum(opt, 0, &m0, &n0));
  CHECK(n0 == kA);
  for (int i = 0; i < kA; ++i) CHECK(m0[i] == 0.0f);

  CHECK_OK(muonrt_optimizer_step(opt, NULL));
  CHECK(muonrt_optimizer_step_count(opt) == 1);
  CHECK(memcmp(a, a0, sizeof(a)) != 0);
  CHECK(memcmp(b, b0, sizeof(b)) != 0);
  CHECK(memcmp(c, c0, sizeof(c)) != 0);
  for (int i = 0; i < kA; ++i) CHECK(isfinite(a[i]) && a[i] != a0[i]);
  for (int i = 0; i < kC; ++i) CHECK(isfinite(FromBf16(c[i])));
  /* Momentum after one step from zero: lerp(0, g, 1 - 0.95). */
  const float* m1 = NULL;
  int64_t n1 = 0;
  CHECK_OK(muonrt_optimizer_momentum(opt, 0, &m1, &n1));
  CHECK(m1 == m0 && n1 == kA);
  for (int i = 0; i < kA; ++i) {
    CHECK(fabsf(m1[i] - 0.05f * ga[i]) <= 1e-7f * (1 + fabsf(ga[i])));
  }
  const float* mc = NULL;
  int64_t nc = 0;
  CHECK_OK(muonrt_optimizer_momentum(opt, 2, &mc, &nc));
  CHECK(nc == kC);
  for (int i = 0; i < kC; ++i) {
    /* A bf16 parameter's buffer is bf16 (as torch.optim.Muon keeps it):
     * lerp(0, g, 0.05) rounded to nearest even. */
    const float g = FromBf16(gc[i]);
    CHECK(mc[i] == FromBf16(ToBf16(mc[i])));
    CHECK(fabsf(mc[i] - 0.05f * g) <= 0.004f * fabsf(0.05f * g) + 1e-30f);
  }
  muonrt_step_stats stats;
  CHECK_OK(muonrt_optimizer_last_step_stats(opt, &stats));
  CHECK(stats.step == 1);
  CHECK(stats.matrices_orthogonalized == 3);
  CHECK(stats.ns_flops > 0);
  CHECK(stats.bytes_sent == 0 && stats.bytes_received == 0);
  CHECK(stats.step_time_s >= 0);

  /* A moved gradient: re-bound, then a second step reads it. */
  float ga2[kA];
  Fill(ga2, kA, 7);
  CHECK_OK(muonrt_optimizer_set_grad(opt, 0, ga2));
  CHECK_OK(muonrt_optimizer_step(opt, NULL));
  CHECK(muonrt_optimizer_step_count(opt) == 2);
done:
  muonrt_optimizer_destroy(opt);
}

/* Two steps of a wide and a tall fp32 matrix (the tall one is transposed
 * inside Newton-Schulz) against ReferenceStep, for two option sets. */
static void RunReference(const muonrt_options* options, const RefOptions* ref,
                         int set_hyper) {
  enum { kW = 3 * 5, kT = 6 * 4 };
  float w[kW], t[kT], gw[kW], gt[kT];
  double rw[kW], rt[kT], rbw[kW] = {0}, rbt[kT] = {0}, dgw[kW], dgt[kT];
  const int64_t sw[2] = {3, 5}, st[2] = {6, 4};
  muonrt_optimizer* opt = NULL;
  Fill(w, kW, 11);
  Fill(t, kT, 12);
  for (int i = 0; i < kW; ++i) rw[i] = w[i];
  for (int i = 0; i < kT; ++i) rt[i] = t[i];
  muonrt_param params[2];
  params[0] = Param2D("wide", w, gw, sw);
  params[1] = Param2D("tall", t, gt, st);
  CHECK_OK(
      muonrt_optimizer_create(NULL, 0, NULL, NULL, params, 2, options, &opt));
  RefOptions tall_ref = *ref;
  if (set_hyper) {
    /* Parameter 1 in its own param group: lr 0.3, no weight decay,
     * momentum 0.8. */
    CHECK_OK(muonrt_optimizer_set_hyperparameters(opt, 1, 0.3, 0.0, 0.8));
    tall_ref.lr = 0.3;
    tall_ref.weight_decay = 0.0;
    tall_ref.momentum = 0.8;
  }
  for (int step = 0; step < 2; ++step) {
    Fill(gw, kW, 20 + step);
    Fill(gt, kT, 30 + step);
    for (int i = 0; i < kW; ++i) dgw[i] = gw[i];
    for (int i = 0; i < kT; ++i) dgt[i] = gt[i];
    CHECK_OK(muonrt_optimizer_step(opt, NULL));
    ReferenceStep(rw, dgw, rbw, 3, 5, ref);
    ReferenceStep(rt, dgt, rbt, 6, 4, &tall_ref);
  }
  /* Parameters within 1e-5 of the size of the update (float32 NS vs
   * float64); momentum within float32 rounding. */
  double update = 0;
  for (int i = 0; i < kW; ++i) {
    double d = fabs(rw[i] - Value(11, i));
    if (d > update) update = d;
  }
  CHECK(update > 1e-3);
  for (int i = 0; i < kW; ++i) {
    if (!(fabs(w[i] - rw[i]) <= 1e-5 * update)) {
      fprintf(stderr, "wide[%d] = %.9g, reference %.9g\n", i, w[i], rw[i]);
      CHECK(0);
    }
  }
  update = 0;
  for (int i = 0; i < kT; ++i) {
    double d = fabs(rt[i] - Value(12, i));
    if (d > update) update = d;
  }
  for (int i = 0; i < kT; ++i) {
    if (!(fabs(t[i] - rt[i]) <= 1e-5 * update)) {
      fprintf(stderr, "tall[%d] = %.9g, reference %.9g\n", i, t[i], rt[i]);
      CHECK(0);
    }
  }
  const float* m = NULL;
  int64_t n = 0;
  CHECK_OK(muonrt_optimizer_momentum(opt, 1, &m, &n));
  CHECK(n == kT);
  for (int i = 0; i < kT; ++i) {
    CHECK(fabs(m[i] - rbt[i]) <= 1e-6 * (fabs(rbt[i]) + 1e-3));
  }
done:
  muonrt_optimizer_destroy(opt);
}

static void Step_Fp32_MatchesFloat64TorchReference(void) {
  muonrt_options options;
  muonrt_options_default(&options);
  options.lr = 0.2;
  options.weight_decay = 0.1;
  RefOptions ref = {0.2, 0.1, 0.95, 3.4445, -4.7750, 2.0315, 1e-7, 1, 5, 0};
  RunReference(&options, &ref, 0);
}

static void Step_TransactionalStep_MatchesFloat64TorchReference(void) {
  muonrt_options options;
  muonrt_options_default(&options);
  options.lr = 0.2;
  options.weight_decay = 0.1;
  options.transactional_step = 1;
  RefOptions ref = {0.2, 0.1, 0.95, 3.4445, -4.7750, 2.0315, 1e-7, 1, 5, 0};
  RunReference(&options, &ref, 0);
}

static void Step_NoNesterovMatchRmsAdamwParamGroups_MatchesReference(void) {
  muonrt_options options;
  muonrt_options_default(&options);
  options.lr = 0.1;
  options.weight_decay = 0.05;
  options.momentum = 0.9;
  options.nesterov = 0;
  options.ns_steps = 3;
  options.adjust_lr_fn = "match_rms_adamw";
  RefOptions ref = {0.1, 0.05, 0.9, 3.4445, -4.7750, 2.0315, 1e-7, 0, 3, 1};
  RunReference(&options, &ref, 1);
}

/* One parameter with one field broken by `Break`; create must fail with
 * `code` and a message containing `text`, and leave *out NULL. */
typedef void (*BreakFn)(muonrt_param* p);
static int ExpectCreateError(BreakFn brk, int code, const char* text) {
  float w[12] = {0}, g[12] = {0};
  static const int64_t shape[2] = {4, 3};
  muonrt_param p = Param2D("layers.0.w", w, g, shape);
  brk(&p);
  muonrt_optimizer* opt = (muonrt_optimizer*)&p; /* must become NULL */
  const int got =
      muonrt_optimizer_create(NULL, 0, NULL, NULL, &p, 1, NULL, &opt);
  if (got != code || opt != NULL || strstr(muonrt_last_error(), text) == NULL) {
    fprintf(stderr,
            "create returned %d (expected %d), out %p, message \"%s\" "
            "(expected to contain \"%s\")\n",
            got, code, (void*)opt, muonrt_last_error(), text);
    if (got == MUONRT_OK) muonrt_optimizer_destroy(opt);
    return 0;
  }
  return 1;
}

static void NullName(muonrt_param* p) { p->name = NULL; }
static void EmptyName(muonrt_param* p) { p->name = ""; }
static void OneDim(muonrt_param* p) {
  static const int64_t s[1] = {12};
  p->ndim = 1;
  p->local_shape = s;
}
static void HugeNdim(muonrt_param* p) { p->ndim = 1000000; }
static void NegativeNdim(muonrt_param* p) { p->ndim = -1; }
static void NullShape(muonrt_param* p) { p->local_shape = NULL; }
static void NegativeDim(muonrt_param* p) {
  static const int64_t s[2] = {4, -3};
  p->local_shape = s;
}
static void OverflowingShape(muonrt_param* p) {
  static const int64_t s[2] = {INT64_C(1) << 40, INT64_C(1) << 40};
  p->local_shape = s;
}
static void NonContiguous(muonrt_param* p) {
  static const int64_t strides[2] = {1, 4}; /* a transposed [3, 4] */
  p->strides = strides;
}
static void ContiguousStrides(muonrt_param* p) {
  static const int64_t strides[2] = {3, 1};
  p->strides = strides;
}
static void Cuda(muonrt_param* p) {
  p->device_type = MUONRT_CUDA;
  p->device_index = 0;
}
static void BadDevice(muonrt_param* p) { p->device_type = 7; }
static void BadDtype(muonrt_param* p) { p->dtype = 5; }
static void BadGradDtype(muonrt_param* p) { p->grad_dtype = -1; }
static void NullData(muonrt_param* p) { p->data = NULL; }
static void ThreeDimNotStack(muonrt_param* p) {
  static const int64_t s[3] = {2, 2, 3};
  p->ndim = 3;
  p->local_shape = s;
}

static void Create_BadParams_ReturnInvalidArgumentOrUnimplemented(void) {
  CHECK(ExpectCreateError(NullName, MUONRT_INVALID_ARGUMENT,
                          "params[0].name is NULL"));
  CHECK(ExpectCreateError(EmptyName, MUONRT_INVALID_ARGUMENT, "empty"));
  CHECK(ExpectCreateError(OneDim, MUONRT_INVALID_ARGUMENT,
                          "Muon only supports 2D parameters"));
  CHECK(ExpectCreateError(ThreeDimNotStack, MUONRT_INVALID_ARGUMENT,
                          "Muon only supports 2D parameters"));
  CHECK(ExpectCreateError(HugeNdim, MUONRT_INVALID_ARGUMENT, "ndim 1000000"));
  CHECK(ExpectCreateError(NegativeNdim, MUONRT_INVALID_ARGUMENT, "ndim -1"));
  CHECK(ExpectCreateError(NullShape, MUONRT_INVALID_ARGUMENT,
                          "local_shape is NULL"));
  CHECK(ExpectCreateError(NegativeDim, MUONRT_INVALID_ARGUMENT, "negative"));
  CHECK(ExpectCreateError(OverflowingShape, MUONRT_INVALID_ARGUMENT,
                          "more than"));
  CHECK(
      ExpectCreateError(NonContiguous, MUONRT_INVALID_ARGUMENT, "contiguous"));
  /* CUDA parameters are accepted; this library (the default build) has no
   * CUDA, which the error says, naming the device. */
  CHECK(ExpectCreateError(Cuda, MUONRT_UNIMPLEMENTED, "cuda:0"));
  CHECK_ERROR_HAS("--config=cuda");
  CHECK(ExpectCreateError(BadDevice, MUONRT_INVALID_ARGUMENT, "device_type"));
  CHECK(ExpectCreateError(BadDtype, MUONRT_INVALID_ARGUMENT, "dtype 5"));
  CHECK(ExpectCreateError(BadGradDtype, MUONRT_INVALID_ARGUMENT,
                          "grad_dtype -1"));
  CHECK(ExpectCreateError(NullData, MUONRT_INVALID_ARGUMENT, "data pointer"));
  /* After a success the message is empty again. */
  {
    float w[12] = {0}, g[12] = {0};
    const int64_t shape[2] = {4, 3};
    muonrt_param p = Param2D("w", w, g, shape);
    ContiguousStrides(&p);
    muonrt_optimizer* opt = NULL;
    CHECK(strcmp(muonrt_last_error(), "") != 0);
    CHECK_OK(muonrt_optimizer_create(NULL, 0, NULL, NULL, &p, 1, NULL, &opt));
    CHECK(strcmp(muonrt_last_error(), "") == 0);
    muonrt_optimizer_destroy(opt);
  }
done:;
}

/* Options muonrt_optimizer_create refuses, each with its message. */
static void NegativeLr(muonrt_options* o) { o->lr = -1; }
static void BogusAdjustLr(muonrt_options* o) { o->adjust_lr_fn = "bogus"; }
static void NesterovTwo(muonrt_options* o) { o->nesterov = 2; }
static void TransactionalTwo(muonrt_options* o) { o->transactional_step = 2; }
static void AsyncMinusSeven(muonrt_options* o) {
  o->async_gpu_parallelism = -7;
}
static void Fp64(muonrt_options* o) { o->gpu_precision = "fp64"; }
static void ReplanMinusOne(muonrt_options* o) { o->replan_every_steps = -1; }
static void Int8Exchange(muonrt_options* o) { o->exchange_dtype = "int8"; }
static const struct {
  void (*edit)(muonrt_options*);
  const char* message;
} kBadOptions[] = {
    {NegativeLr, "Learning rate should be >= 0"},
    {BogusAdjustLr, "bogus"},
    {NesterovTwo, "nesterov 2"},
    {TransactionalTwo, "transactional_step 2"},
    {AsyncMinusSeven, "async_gpu_parallelism -7"},
    {Fp64, "execution.gpu_precision \"fp64\""},
    {ReplanMinusOne, "replan_every_steps"},
    {Int8Exchange, "int8"},
};

static void Create_BadArguments_ReturnInvalidArgument(void) {
  float w[12] = {0}, g[12] = {0};
  const int64_t shape[2] = {4, 3};
  muonrt_param p = Param2D("w", w, g, shape);
  muonrt_optimizer* opt = NULL;
  muonrt_options options;
  CHECK_CODE(muonrt_optimizer_create(NULL, 0, NULL, NULL, &p, 1, NULL, NULL),
             MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("out is NULL");
  CHECK_CODE(muonrt_optimizer_create(NULL, 0, NULL, NULL, &p, -1, NULL, &opt),
             MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("num_params -1");
  CHECK_CODE(muonrt_optimizer_create(NULL, 0, NULL, NULL, NULL, 2, NULL, &opt),
             MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("params is NULL");
  CHECK(opt == NULL);
  /* torch's argument errors; flags that are neither 0 nor 1; and the
   * execution options, checked as muonrt_options_validate checks them, also
   * without a process group (the single-device path). */
  for (size_t i = 0; i < sizeof(kBadOptions) / sizeof(kBadOptions[0]); ++i) {
    muonrt_options_default(&options);
    kBadOptions[i].edit(&options);
    CHECK_CODE(
        muonrt_optimizer_create(NULL, 0, NULL, NULL, &p, 1, &options, &opt),
        MUONRT_INVALID_ARGUMENT);
    CHECK_ERROR_HAS(kBadOptions[i].message);
  }
  CHECK(opt == NULL);
  /* Zero parameters is an optimizer that does nothing. */
  CHECK_OK(muonrt_optimizer_create(NULL, 0, NULL, NULL, NULL, 0, NULL, &opt));
  CHECK_OK(muonrt_optimizer_step(opt, NULL));
  /* A stream is for CUDA parameters; CPU parameters take NULL. */
  {
    int not_a_stream = 0;
    CHECK_CODE(muonrt_optimizer_step(opt, &not_a_stream),
               MUONRT_INVALID_ARGUMENT);
    CHECK_ERROR_HAS("CPU tensors");
  }
done:
  muonrt_optimizer_destroy(opt);
}

static void NullHandles_ReturnInvalidArgument(void) {
  const float* data = NULL;
  int64_t numel = 0;
  size_t len = 0;
  muonrt_step_stats stats;
  CHECK_CODE(muonrt_optimizer_step(NULL, NULL), MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("opt is NULL");
  CHECK_CODE(muonrt_optimizer_set_grad(NULL, 0, NULL), MUONRT_INVALID_ARGUMENT);
  CHECK_CODE(muonrt_optimizer_set_hyperparameters(NULL, 0, 1, 1, 0.9),
             MUONRT_INVALID_ARGUMENT);
  CHECK(muonrt_optimizer_step_count(NULL) == -1);
  CHECK_ERROR_HAS("opt is NULL");
  CHECK_CODE(muonrt_optimizer_momentum(NULL, 0, &data, &numel),
             MUONRT_INVALID_ARGUMENT);
  CHECK_CODE(muonrt_optimizer_load_state(NULL, 0, NULL, NULL, 0),
             MUONRT_INVALID_ARGUMENT);
  CHECK_CODE(muonrt_optimizer_save(NULL, "/tmp"), MUONRT_INVALID_ARGUMENT);
  CHECK_CODE(muonrt_optimizer_load(NULL, "/tmp"), MUONRT_INVALID_ARGUMENT);
  CHECK_CODE(muonrt_optimizer_plan_json(NULL, NULL, 0, &len),
             MUONRT_INVALID_ARGUMENT);
  CHECK_CODE(muonrt_optimizer_assignments_json(NULL, NULL, 0, &len),
             MUONRT_INVALID_ARGUMENT);
  CHECK_CODE(muonrt_optimizer_last_step_stats(NULL, &stats),
             MUONRT_INVALID_ARGUMENT);
  CHECK(muonrt_pg_rank(NULL) == -1);
  CHECK_ERROR_HAS("pg is NULL");
  CHECK(muonrt_pg_world_size(NULL) == -1);
  CHECK(muonrt_pg_coordinator_address(NULL) == NULL);
  CHECK_ERROR_HAS("pg is NULL");
  CHECK_CODE(muonrt_pg_barrier(NULL), MUONRT_INVALID_ARGUMENT);
  CHECK_CODE(muonrt_pg_report_create_failure(NULL, "check failed"),
             MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("muonrt_pg_report_create_failure: pg is NULL");
  CHECK_CODE(muonrt_pg_init_from_env(0, NULL), MUONRT_INVALID_ARGUMENT);
  muonrt_optimizer_destroy(NULL);
  muonrt_pg_destroy(NULL);
  CHECK(strcmp(muonrt_last_error(), "") == 0);
done:;
}

/* A step without a gradient fails before touching anything; index and
 * hyper-parameter errors. */
static void Step_MissingGrad_FailedPreconditionAndUntouched(void) {
  float a[12], b[15], ga[12], a0[12], b0[15];
  const int64_t sa[2] = {4, 3}, sb[2] = {3, 5};
  muonrt_optimizer* opt = NULL;
  Fill(a, 12, 1);
  Fill(b, 15, 2);
  Fill(ga, 12, 3);
  memcpy(a0, a, sizeof(a));
  memcpy(b0, b, sizeof(b));
  muonrt_param params[2];
  params[0] = Param2D("a", a, ga, sa);
  params[1] = Param2D("b", b, NULL, sb); /* no gradient yet */
  CHECK_OK(muonrt_optimizer_create(NULL, 0, NULL, NULL, params, 2, NULL, &opt));
  CHECK_CODE(muonrt_optimizer_step(opt, NULL), MUONRT_FAILED_PRECONDITION);
  CHECK_ERROR_HAS("\"b\" has no gradient");
  CHECK(memcmp(a, a0, sizeof(a)) == 0);
  CHECK(memcmp(b, b0, sizeof(b)) == 0);
  CHECK(muonrt_optimizer_step_count(opt) == 0);
  {
    const float* m = NULL;
    int64_t n = 0;
    CHECK_OK(muonrt_optimizer_momentum(opt, 0, &m, &n));
    for (int i = 0; i < n; ++i) CHECK(m[i] == 0.0f);
    CHECK_CODE(muonrt_optimizer_momentum(opt, 2, &m, &n), MUONRT_OUT_OF_RANGE);
    CHECK_CODE(muonrt_optimizer_momentum(opt, -1, &m, &n), MUONRT_OUT_OF_RANGE);
    CHECK_CODE(muonrt_optimizer_momentum(opt, 0, NULL, &n),
               MUONRT_INVALID_ARGUMENT);
    CHECK_CODE(muonrt_optimizer_momentum(opt, 0, &m, NULL),
               MUONRT_INVALID_ARGUMENT);
  }
  CHECK_CODE(muonrt_optimizer_set_grad(opt, 2, ga), MUONRT_OUT_OF_RANGE);
  CHECK_CODE(muonrt_optimizer_set_hyperparameters(opt, 5, 0.1, 0.1, 0.9),
             MUONRT_OUT_OF_RANGE);
  CHECK_CODE(muonrt_optimizer_set_hyperparameters(opt, 0, -0.1, 0.1, 0.9),
             MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("Learning rate should be >= 0");
  CHECK_CODE(muonrt_optimizer_set_hyperparameters(opt, 0, 0.1, NAN, 0.9),
             MUONRT_INVALID_ARGUMENT);
  CHECK_CODE(muonrt_optimizer_set_hyperparameters(opt, 0, 0.1, 0.1, -1.0),
             MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("momentum should be >= 0 but is: -1.0");
  /* With the gradient bound the step goes through. */
  {
    float gb[15];
    Fill(gb, 15, 9);
    CHECK_OK(muonrt_optimizer_set_grad(opt, 1, gb));
    CHECK_OK(muonrt_optimizer_step(opt, NULL));
  }
  CHECK(strcmp(muonrt_last_error(), "") == 0);
  CHECK(memcmp(b, b0, sizeof(b)) != 0);
  /* The caller's own refusal: FAILED_PRECONDITION with its reason,
   * nothing modified, the step count kept. */
  memcpy(a0, a, sizeof(a));
  CHECK_CODE(muonrt_optimizer_refuse_step(opt, "gradient of \"a\" is int8"),
             MUONRT_FAILED_PRECONDITION);
  CHECK_ERROR_HAS("rank 0: gradient of \"a\" is int8");
  CHECK(memcmp(a, a0, sizeof(a)) == 0);
  CHECK(muonrt_optimizer_step_count(opt) == 1);
  CHECK_CODE(muonrt_optimizer_refuse_step(opt, NULL), MUONRT_INVALID_ARGUMENT);
  CHECK_CODE(muonrt_optimizer_refuse_step(NULL, "x"), MUONRT_INVALID_ARGUMENT);
  /* Un-binding makes the next step fail again, untouched. */
  CHECK_OK(muonrt_optimizer_set_grad(opt, 0, NULL));
  memcpy(a0, a, sizeof(a));
  CHECK_CODE(muonrt_optimizer_step(opt, NULL), MUONRT_FAILED_PRECONDITION);
  CHECK(memcmp(a, a0, sizeof(a)) == 0);
  CHECK(muonrt_optimizer_step_count(opt) == 1);
done:
  muonrt_optimizer_destroy(opt);
}

/* The buffer protocol: too small -> OUT_OF_RANGE with the length and
 * nothing written; then the text. */
static void CheckJson(const muonrt_optimizer* opt,
                      int (*fn)(const muonrt_optimizer*, char*, size_t,
                                size_t*),
                      const char* must_contain) {
  size_t len = 0;
  char* buf = NULL;
  CHECK_CODE(fn(opt, NULL, 0, &len), MUONRT_OUT_OF_RANGE);
  CHECK(len > 2);
  CHECK_ERROR_HAS("*len + 1");
  buf = (char*)malloc(len + 1);
  CHECK(buf != NULL);
  memset(buf, 'x', len + 1);
  size_t len2 = 0;
  CHECK_CODE(fn(opt, buf, len, &len2), MUONRT_OUT_OF_RANGE); /* no room */
  CHECK(len2 == len);
  for (size_t i = 0; i < len + 1; ++i) CHECK(buf[i] == 'x');
  CHECK_CODE(fn(opt, NULL, 5, &len2), MUONRT_INVALID_ARGUMENT);
  CHECK_CODE(fn(opt, buf, len + 1, NULL), MUONRT_INVALID_ARGUMENT);
  CHECK_OK(fn(opt, buf, len + 1, &len2));
  CHECK(len2 == len);
  CHECK(strlen(buf) == len);
  CHECK(buf[0] == '{' && buf[len - 1] == '}');
  if (strstr(buf, must_contain) == NULL) {
    fprintf(stderr, "JSON \"%s\" lacks \"%s\"\n", buf, must_contain);
    CHECK(0);
  }
done:
  free(buf);
}

static void PlanAndAssignmentsJson_BufferProtocol(void) {
  float a[12] = {0}, b[15] = {0};
  const int64_t sa[2] = {4, 3}, sb[2] = {3, 5};
  muonrt_optimizer* opt = NULL;
  muonrt_param params[2];
  params[0] = Param2D("a", a, a, sa);
  params[1] = Param2D("b", b, b, sb);
  CHECK_OK(muonrt_optimizer_create(NULL, 0, NULL, NULL, params, 2, NULL, &opt));
  CheckJson(opt, muonrt_optimizer_plan_json, "\"world_size\":1");
  CHECK(!g_test_failed);
  CheckJson(opt, muonrt_optimizer_assignments_json, "{\"0\": [0, 1]}");
done:
  muonrt_optimizer_destroy(opt);
}

/* Three params (fp32, fp32, bf16) with fixed gradients; steps `steps`. */
typedef struct {
  float a[12], b[15], ga[12], gb[15];
  uint16_t c[16], gc[16];
  int64_t sa[2], sb[2], sc[2];
  muonrt_param params[3];
} Model;

static void InitModel(Model* m) {
  Fill(m->a, 12, 41);
  Fill(m->b, 15, 42);
  Fill(m->ga, 12, 43);
  Fill(m->gb, 15, 44);
  for (int i = 0; i < 16; ++i) {
    m->c[i] = ToBf16(Value(45, i));
    m->gc[i] = ToBf16(Value(46, i));
  }
  m->sa[0] = 4;
  m->sa[1] = 3;
  m->sb[0] = 3;
  m->sb[1] = 5;
  m->sc[0] = 2;
  m->sc[1] = 8;
  m->params[0] = Param2D("enc.w", m->a, m->ga, m->sa);
  m->params[1] = Param2D("dec.w", m->b, m->gb, m->sb);
  m->params[2] = Param2D("emb.w", m->c, m->gc, m->sc);
  m->params[2].dtype = MUONRT_BFLOAT16;
  m->params[2].grad_dtype = MUONRT_BFLOAT16;
}

static int SameMomentum(muonrt_optimizer* x, muonrt_optimizer* y) {
  for (int i = 0; i < 3; ++i) {
    const float *mx = NULL, *my = NULL;
    int64_t nx = -1, ny = -2;
    if (muonrt_optimizer_momentum(x, i, &mx, &nx) != MUONRT_OK ||
        muonrt_optimizer_momentum(y, i, &my, &ny) != MUONRT_OK || nx != ny ||
        memcmp(mx, my, (size_t)nx * sizeof(float)) != 0) {
      return 0;
    }
  }
  return 1;
}

static void SaveLoad_FreshOptimizer_RestoresMomentumAndStep(void) {
  Model m1, m2;
  muonrt_optimizer *x = NULL, *y = NULL;
  char dir[256];
  InitModel(&m1);
  InitModel(&m2);
  CHECK_OK(
      muonrt_optimizer_create(NULL, 0, NULL, NULL, m1.params, 3, NULL, &x));
  CHECK_OK(
      muonrt_optimizer_create(NULL, 0, NULL, NULL, m2.params, 3, NULL, &y));
  CHECK_OK(muonrt_optimizer_step(x, NULL));
  CHECK_OK(muonrt_optimizer_step(x, NULL));
  CHECK(!SameMomentum(x, y));
  CHECK(MakeDir(dir, "capi_ckpt"));
  CHECK_CODE(muonrt_optimizer_save(x, NULL), MUONRT_INVALID_ARGUMENT);
  CHECK_OK(muonrt_optimizer_save(x, dir));
  const float* before = NULL;
  int64_t n = 0;
  CHECK_OK(muonrt_optimizer_momentum(y, 0, &before, &n));
  CHECK_OK(muonrt_optimizer_load(y, dir));
  CHECK(SameMomentum(x, y));
  CHECK(muonrt_optimizer_step_count(y) == 2);
  {
    const float* after = NULL;
    CHECK_OK(muonrt_optimizer_momentum(y, 0, &after, &n));
    CHECK(after == before); /* the pointer stays valid */
  }
  /* Same parameters and state: the next step agrees bitwise. */
  memcpy(m2.a, m1.a, sizeof(m1.a));
  memcpy(m2.b, m1.b, sizeof(m1.b));
  memcpy(m2.c, m1.c, sizeof(m1.c));
  CHECK_OK(muonrt_optimizer_step(x, NULL));
  CHECK_OK(muonrt_optimizer_step(y, NULL));
  CHECK(memcmp(m1.a, m2.a, sizeof(m1.a)) == 0);
  CHECK(memcmp(m1.b, m2.b, sizeof(m1.b)) == 0);
  CHECK(memcmp(m1.c, m2.c, sizeof(m1.c)) == 0);
  CHECK(SameMomentum(x, y));
  CHECK(muonrt_optimizer_step_count(y) == 3);
  /* A directory without a checkpoint: an error naming it; unchanged. */
  {
    char empty[256];
    CHECK(MakeDir(empty, "capi_empty"));
    const int code = muonrt_optimizer_load(y, empty);
    CHECK(code != MUONRT_OK);
    CHECK_ERROR_HAS(empty);
    CHECK(SameMomentum(x, y));
    CHECK(muonrt_optimizer_step_count(y) == 3);
  }
done:
  muonrt_optimizer_destroy(x);
  muonrt_optimizer_destroy(y);
}

static void LoadState_SizesChecked_AllOrNothing(void) {
  Model m;
  muonrt_optimizer* opt = NULL;
  InitModel(&m);
  CHECK_OK(
      muonrt_optimizer_create(NULL, 0, NULL, NULL, m.params, 3, NULL, &opt));
  CHECK_OK(muonrt_optimizer_step(opt, NULL));
  float s0[12], s1[15], s2[16], keep0[12];
  Fill(s0, 12, 51);
  Fill(s1, 15, 52);
  Fill(s2, 16, 53);
  const float* bufs[3] = {s0, s1, s2};
  int64_t numels[3] = {12, 15, 16};
  const float* m0 = NULL;
  int64_t n0 = 0;
  CHECK_OK(muonrt_optimizer_momentum(opt, 0, &m0, &n0));
  memcpy(keep0, m0, sizeof(keep0));

  CHECK_CODE(muonrt_optimizer_load_state(opt, 7, bufs, numels, 2),
             MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("num_params 2");
  numels[1] = 14;
  CHECK_CODE(muonrt_optimizer_load_state(opt, 7, bufs, numels, 3),
             MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("(\"dec.w\") has 14 momentum values");
  numels[1] = 15;
  CHECK_CODE(muonrt_optimizer_load_state(opt, -1, bufs, numels, 3),
             MUONRT_INVALID_ARGUMENT);
  CHECK_CODE(muonrt_optimizer_load_state(opt, 7, NULL, numels, 3),
             MUONRT_INVALID_ARGUMENT);
  CHECK_CODE(muonrt_optimizer_load_state(opt, 7, bufs, NULL, 3),
             MUONRT_INVALID_ARGUMENT);
  bufs[2] = NULL;
  CHECK_CODE(muonrt_optimizer_load_state(opt, 7, bufs, numels, 3),
             MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("buffers[2]");
  bufs[2] = s2;
  /* Nothing changed by the failures (parameter 0 came before the bad one). */
  CHECK(memcmp(m0, keep0, sizeof(keep0)) == 0);
  CHECK(muonrt_optimizer_step_count(opt) == 1);

  CHECK_OK(muonrt_optimizer_load_state(opt, 7, bufs, numels, 3));
  CHECK(muonrt_optimizer_step_count(opt) == 7);
  for (int i = 0; i < 3; ++i) {
    const float* mi = NULL;
    int64_t ni = 0;
    CHECK_OK(muonrt_optimizer_momentum(opt, i, &mi, &ni));
    CHECK(ni == numels[i]);
    if (i == 2) {
      /* The bf16 parameter's buffer is bf16: the values rounded. */
      for (int64_t k = 0; k < ni; ++k) {
        CHECK(mi[k] == FromBf16(ToBf16(bufs[i][k])));
      }
    } else {
      CHECK(memcmp(mi, bufs[i], (size_t)ni * sizeof(float)) == 0);
    }
    if (i == 0) CHECK(mi == m0);
  }
done:
  muonrt_optimizer_destroy(opt);
}

/* NorMuon (muonrt_options.normuon): one row state value per row
 * (muonrt_optimizer_row_state, named "variance_neuron"; none and "" without
 * NorMuon), set with the
 * momentum by muonrt_optimizer_load_full_state, all or nothing. */
static void NorMuon_RowStateReadAndLoadedAllOrNothing(void) {
  Model m;
  muonrt_optimizer *opt = NULL, *plain = NULL;
  InitModel(&m);
  muonrt_options o;
  muonrt_options_default(&o);
  CHECK(o.normuon == 0 && o.normuon_beta2 == 0.95 && o.normuon_eps == 1e-8);
  o.normuon = 2;
  CHECK_CODE(muonrt_options_validate(&o), MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("normuon 2 is neither 0 nor 1");
  o.normuon = 1;
  CHECK_OK(muonrt_optimizer_create(NULL, 0, NULL, NULL, m.params, 3, &o, &opt));
  CHECK_OK(
      muonrt_optimizer_create(NULL, 0, NULL, NULL, m.params, 3, NULL, &plain));
  CHECK_OK(muonrt_optimizer_step(opt, NULL));
  const char* name = NULL;
  CHECK_OK(muonrt_optimizer_row_state_name(opt, &name));
  CHECK(strcmp(name, "variance_neuron") == 0);
  CHECK_OK(muonrt_optimizer_row_state_name(plain, &name));
  CHECK(strcmp(name, "") == 0);
  CHECK_CODE(muonrt_optimizer_row_state_name(opt, NULL),
             MUONRT_INVALID_ARGUMENT);
  const float* v0 = NULL;
  int64_t n0 = -1;
  CHECK_OK(muonrt_optimizer_row_state(opt, 0, &v0, &n0));
  CHECK(n0 == 4); /* enc.w is 4 x 3 */
  for (int r = 0; r < 4; ++r) CHECK(v0[r] > 0.0f);
  float keep_v0[4];
  memcpy(keep_v0, v0, sizeof(keep_v0));
  const float* none = NULL;
  int64_t n_none = -1;
  CHECK_OK(muonrt_optimizer_row_state(plain, 0, &none, &n_none));
  CHECK(n_none == 0);

  float s0[12], s1[15], s2[16], r0[4], r1[3], r2[2];
  Fill(s0, 12, 61);
  Fill(s1, 15, 62);
  Fill(s2, 16, 63);
  Fill(r0, 4, 64);
  Fill(r1, 3, 65);
  Fill(r2, 2, 66);
  const float* bufs[3] = {s0, s1, s2};
  const float* rows[3] = {r0, r1, r2};
  int64_t numels[3] = {12, 15, 16};
  int64_t row_numels[3] = {4, 3, 1};
  CHECK_CODE(muonrt_optimizer_load_full_state(opt, 5, bufs, numels, rows,
                                              row_numels, 3),
             MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("(\"emb.w\") has 1 variance_neuron values");
  CHECK_CODE(
      muonrt_optimizer_load_full_state(opt, 5, bufs, numels, rows, NULL, 3),
      MUONRT_INVALID_ARGUMENT);
  /* Nothing changed by the failures. */
  CHECK_OK(muonrt_optimizer_row_state(opt, 0, &v0, &n0));
  CHECK(memcmp(v0, keep_v0, sizeof(keep_v0)) == 0);
  CHECK(muonrt_optimizer_step_count(opt) == 1);

  row_numels[2] = 2;
  CHECK_OK(muonrt_optimizer_load_full_state(opt, 5, bufs, numels, rows,
                                            row_numels, 3));
  CHECK(muonrt_optimizer_step_count(opt) == 5);
  for (int i = 0; i < 3; ++i) {
    const float* vi = NULL;
    int64_t ni = 0;
    CHECK_OK(muonrt_optimizer_row_state(opt, i, &vi, &ni));
    CHECK(ni == row_numels[i]);
    CHECK(memcmp(vi, rows[i], (size_t)ni * sizeof(float)) == 0);
  }
done:
  muonrt_optimizer_destroy(opt);
  muonrt_optimizer_destroy(plain);
}

/* QK-clip: enc.w (4 x 3) as the query of 2 heads of 2 rows and dec.w
 * (3 x 5) rows 1..2 as their key (one key head, grouped). Head maxima 50
 * and 200 over threshold 100: the group clips with gamma 0.5, alpha 0.5:
 * every q row scaled by sqrt(0.5), k rows 1..2 by sqrt(0.5), row 0 kept. */
static void QkClip_ScalesClippedHeadRowsAndRefusesBadInput(void) {
  Model m;
  muonrt_optimizer* opt = NULL;
  InitModel(&m);
  CHECK_OK(
      muonrt_optimizer_create(NULL, 0, NULL, NULL, m.params, 3, NULL, &opt));
  muonrt_qk_clip_layer layer = {"enc.w", 0, "dec.w", 1, 2, 1, 2, 0, 0};
  CHECK_OK(muonrt_optimizer_set_qk_clip(opt, 100.0, 0.5, &layer, 1));
  float a0[12], b0[15];
  memcpy(a0, m.a, sizeof(a0));
  memcpy(b0, m.b, sizeof(b0));
  const float maxima[2] = {50.0f, 200.0f};
  CHECK_CODE(muonrt_optimizer_clip_qk(opt, maxima, 1, NULL, NULL, NULL),
             MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("ClipQk got 1 maxima");
  CHECK_CODE(muonrt_optimizer_clip_qk(opt, NULL, 2, NULL, NULL, NULL),
             MUONRT_INVALID_ARGUMENT);
  CHECK(memcmp(a0, m.a, sizeof(a0)) == 0);
  int64_t groups = -1;
  float top = 0;
  CHECK_OK(muonrt_optimizer_clip_qk(opt, maxima, 2, &groups, &top, NULL));
  CHECK(groups == 1 && top == 200.0f);
  const float f = (float)sqrt(0.5);
  for (int i = 0; i < 12; ++i) CHECK(m.a[i] == a0[i] * f);
  for (int i = 0; i < 15; ++i) CHECK(m.b[i] == (i < 5 ? b0[i] : b0[i] * f));
  layer.head_dim = 3; /* 2 x 3 query rows: enc.w has 4 */
  CHECK_CODE(muonrt_optimizer_set_qk_clip(opt, 100.0, 0.5, &layer, 1),
             MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("enc.w\" has 4 rows but 2 heads of 3 rows");
done:
  muonrt_optimizer_destroy(opt);
}

/* A free TCP port on 127.0.0.1 (bound and released; 0 on failure). */
static int FreePort(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, (struct sockaddr*)&addr, sizeof(addr)) == 0 &&
      getsockname(fd, (struct sockaddr*)&addr, &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

/* A process group of one rank from torchrun's environment (rank 0 embeds
 * the coordinator): mesh, placement and sub-mesh errors, then a step. */
static void ProcessGroupOfOne_MeshAndPlacementErrors(void) {
  muonrt_process_group* pg = NULL;
  muonrt_optimizer* opt = NULL;
  char port[16];
  const int p = FreePort();
  CHECK(p > 1);
  snprintf(port, sizeof(port), "%d", p - 1);
  /* Environment errors first. */
  unsetenv("RANK");
  setenv("WORLD_SIZE", "1", 1);
  CHECK_CODE(muonrt_pg_init_from_env(5, &pg), MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("RANK");
  CHECK(pg == NULL);
  setenv("RANK", "0", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", port, 1); /* the coordinator listens on port + 1 */
  setenv("MUON_JOB_ID", "capi_test_pg1", 1);
  CHECK_CODE(muonrt_pg_init_from_env(NAN, &pg), MUONRT_INVALID_ARGUMENT);
  CHECK_CODE(muonrt_pg_init_backend_from_env("mpi", -1, 10, &pg),
             MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("backend \"mpi\" is not supported");
  CHECK(pg == NULL);
  CHECK_OK(muonrt_pg_init_from_env(10, &pg));
  CHECK(pg != NULL);
  CHECK(muonrt_pg_rank(pg) == 0);
  CHECK(muonrt_pg_world_size(pg) == 1);
  {
    /* Without a store: MASTER_PORT + 1. */
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%d", p);
    CHECK(strcmp(muonrt_pg_coordinator_address(pg), want) == 0);
  }
  CHECK_OK(muonrt_pg_barrier(pg));
  /* A world of one sends no creation failure (no peer waits): the
   * optimizer below is still created in this job. */
  CHECK_CODE(muonrt_pg_report_create_failure(pg, NULL),
             MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("message is NULL");
  CHECK_OK(muonrt_pg_report_create_failure(pg, "the trainer's check failed"));

  float w[12], g[12], w0[12];
  const int64_t shape[2] = {4, 3};
  Fill(w, 12, 61);
  Fill(g, 12, 62);
  memcpy(w0, w, sizeof(w));
  const char* names[1] = {"dp_shard"};
  int sizes[1] = {1};
  const char* shard0[1] = {"Shard(0)"};
  const char* bad[1] = {"Shard(x)"};
  const char* null_placement[1] = {NULL};
  muonrt_param param = Param2D("blocks.0.w", w, g, shape);
  param.placements = bad;
  CHECK_CODE(
      muonrt_optimizer_create(pg, 1, names, sizes, &param, 1, NULL, &opt),
      MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("\"blocks.0.w\"");
  CHECK_ERROR_HAS("Shard(x)");
  param.placements = null_placement;
  CHECK_CODE(
      muonrt_optimizer_create(pg, 1, names, sizes, &param, 1, NULL, &opt),
      MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("placements[0]");
  param.placements = shard0;
  CHECK_CODE(
      muonrt_optimizer_create(pg, 0, names, sizes, &param, 1, NULL, &opt),
      MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("mesh_ndim 0");
  CHECK_CODE(muonrt_optimizer_create(pg, 1, NULL, sizes, &param, 1, NULL, &opt),
             MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("mesh_names is NULL");
  CHECK_CODE(muonrt_optimizer_create(pg, 1, names, NULL, &param, 1, NULL, &opt),
             MUONRT_INVALID_ARGUMENT);
  sizes[0] = 2;
  CHECK_CODE(
      muonrt_optimizer_create(pg, 1, names, sizes, &param, 1, NULL, &opt),
      MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("world size");
  sizes[0] = 0;
  CHECK_CODE(
      muonrt_optimizer_create(pg, 1, names, sizes, &param, 1, NULL, &opt),
      MUONRT_INVALID_ARGUMENT);
  sizes[0] = 1;
  /* Sub-meshes: names must be mesh dims, coordinates in range. */
  param.sub_mesh = "pp=1";
  CHECK_CODE(
      muonrt_optimizer_create(pg, 1, names, sizes, &param, 1, NULL, &opt),
      MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("\"pp\"");
  param.sub_mesh = "dp_shard";
  CHECK_CODE(
      muonrt_optimizer_create(pg, 1, names, sizes, &param, 1, NULL, &opt),
      MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("<mesh dim>=<coordinate>");
  param.placements = NULL; /* Replicate() */
  param.sub_mesh = "dp_shard=1";
  CHECK_CODE(
      muonrt_optimizer_create(pg, 1, names, sizes, &param, 1, NULL, &opt),
      MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("out of range");
  param.sub_mesh = "dp_shard=0, dp_shard=0";
  CHECK_CODE(
      muonrt_optimizer_create(pg, 1, names, sizes, &param, 1, NULL, &opt),
      MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("twice");
  CHECK(opt == NULL);
  CHECK(memcmp(w, w0, sizeof(w)) == 0);

  /* Valid: Shard(0) over a mesh of one, a sub-mesh holding the rank. */
  param.placements = NULL;
  param.sub_mesh = " dp_shard = 0 ";
  muonrt_options options;
  muonrt_options_default(&options);
  options.assignment_policy = "round_robin";
  CHECK_OK(
      muonrt_optimizer_create(pg, 1, names, sizes, &param, 1, &options, &opt));
  CHECK_OK(muonrt_optimizer_step(opt, NULL));
  CHECK(memcmp(w, w0, sizeof(w)) != 0);
  CHECK(muonrt_optimizer_step_count(opt) == 1);
  {
    char buf[8192];
    size_t len = 0;
    CHECK_OK(muonrt_optimizer_plan_json(opt, buf, sizeof(buf), &len));
    CHECK(strstr(buf, "\"policy\":\"round_robin\"") != NULL);
  }
  CHECK_OK(muonrt_pg_barrier(pg));
done:
  muonrt_optimizer_destroy(opt);
  muonrt_pg_destroy(pg);
}

/* The store of ProcessGroupWithStore_PublishesKernelPickedPort. */
static char g_published[256];

static int Publish(void* ctx, const char* address) {
  (void)ctx;
  snprintf(g_published, sizeof(g_published), "%s", address);
  return 0;
}

static int LookupNothing(void* ctx, double timeout_s, char* buf, int buf_size) {
  (void)ctx;
  (void)timeout_s;
  (void)buf;
  (void)buf_size;
  return 1; /* rank 0 never looks up */
}

/* With the job's store, rank 0's coordinator binds a port the kernel picks
 * (not MASTER_PORT + 1, held here by another socket) and publishes the
 * address it reports; NULL callbacks are refused by name. */
static void ProcessGroupWithStore_PublishesKernelPickedPort(void) {
  muonrt_process_group* pg = NULL;
  int held = -1;
  char port[16];
  const int p = FreePort();
  CHECK(p > 1);
  snprintf(port, sizeof(port), "%d", p - 1);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", port, 1);
  setenv("MUON_JOB_ID", "capi_test_store", 1);
  CHECK_CODE(
      muonrt_pg_init_with_store(NULL, -1, 10, NULL, LookupNothing, NULL, &pg),
      MUONRT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("publish");
  /* Another job holds MASTER_PORT + 1. */
  held = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(held >= 0);
  {
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons((uint16_t)p);
    CHECK(bind(held, (struct sockaddr*)&addr, sizeof(addr)) == 0);
    CHECK(listen(held, 4) == 0);
  }
  g_published[0] = '\0';
  CHECK_OK(muonrt_pg_init_with_store(NULL, -1, 10, Publish, LookupNothing, NULL,
                                     &pg));
  CHECK(strcmp(g_published, muonrt_pg_coordinator_address(pg)) == 0);
  CHECK(strncmp(g_published, "127.0.0.1:", 10) == 0);
  CHECK(atoi(g_published + 10) > 0 && atoi(g_published + 10) != p);
  CHECK_OK(muonrt_pg_barrier(pg));
done:
  muonrt_pg_destroy(pg);
  if (held >= 0) close(held);
}

/* ---- Runner ----------------------------------------------------------- */

typedef struct {
  const char* name;
  void (*fn)(void);
} Test;

#define TEST(f) \
  { #f, f }

int main(void) {
  const Test tests[] = {
      TEST(AbiVersion_IsSeventeen),
      TEST(ComputeThreads_SetAndRefusedOutOfRange),
      TEST(OptionsDefault_AreTorchDefaults),
      TEST(OptionsValidate_NamesTheBadField),
      TEST(Step_Fp32AndBf16_UpdatesInPlace),
      TEST(Step_Fp32_MatchesFloat64TorchReference),
      TEST(Step_TransactionalStep_MatchesFloat64TorchReference),
      TEST(Step_NoNesterovMatchRmsAdamwParamGroups_MatchesReference),
      TEST(Create_BadParams_ReturnInvalidArgumentOrUnimplemented),
      TEST(Create_BadArguments_ReturnInvalidArgument),
      TEST(NullHandles_ReturnInvalidArgument),
      TEST(Step_MissingGrad_FailedPreconditionAndUntouched),
      TEST(PlanAndAssignmentsJson_BufferProtocol),
      TEST(SaveLoad_FreshOptimizer_RestoresMomentumAndStep),
      TEST(LoadState_SizesChecked_AllOrNothing),
      TEST(NorMuon_RowStateReadAndLoadedAllOrNothing),
      TEST(QkClip_ScalesClippedHeadRowsAndRefusesBadInput),
      TEST(ProcessGroupOfOne_MeshAndPlacementErrors),
      TEST(ProcessGroupWithStore_PublishesKernelPickedPort),
  };
  const int n = (int)(sizeof(tests) / sizeof(tests[0]));
  for (int i = 0; i < n; ++i) {
    printf("[ RUN      ] %s\n", tests[i].name);
    fflush(stdout);
    g_test_failed = 0;
    tests[i].fn();
    printf("%s %s\n", g_test_failed ? "[  FAILED  ]" : "[       OK ]",
           tests[i].name);
    g_failed += g_test_failed;
  }
  printf("%d of %d tests passed\n", n - g_failed, n);
  return g_failed == 0 ? 0 : 1;
}
