/* One process of capi_multirank_test, in C over capi/muonrt.h:
 *
 *   capi_rank_main dist OUT_DIR
 *     a rank of a torchrun-style job (RANK, WORLD_SIZE, MASTER_ADDR,
 *     MASTER_PORT from the environment): FSDP views (Shard(0) over the
 *     mesh dp_shard=WORLD_SIZE) of the model below, 3 steps with
 *     deterministic gradients computed from global indices, then writes
 *     its local shards to OUT_DIR/rank_<r>.bin (params in order, raw
 *     little-endian elements) and saves a checkpoint to OUT_DIR/ckpt.
 *   capi_rank_main dist_mismatch OUT_DIR
 *     the same, but the last rank names emb.weight differently: every
 *     rank's create must fail with INVALID_ARGUMENT (the coordinator
 *     compares the manifests); exits 3 when it does.
 *   capi_rank_main dist_bad_dtype OUT_DIR
 *     the same, but the last rank gives a parameter an unknown dtype: its
 *     create fails with INVALID_ARGUMENT before it can join, and every
 *     other rank's create fails at once with INVALID_ARGUMENT naming that
 *     rank ("rank R could not create its optimizer"); exits 3 when it does.
 *   capi_rank_main dist_caller_refused OUT_DIR
 *     the same, but the last rank's own check fails before it creates its
 *     optimizer: it calls muonrt_pg_report_create_failure instead, and
 *     every other rank's create fails at once with INVALID_ARGUMENT naming
 *     that rank and its message; exits 3 when it does.
 *   capi_rank_main single OUT_DIR
 *     the same model on a single device (no process group), the same 3
 *     steps; writes OUT_DIR/single.bin, then loads OUT_DIR/ckpt (the
 *     distributed checkpoint, resharded) into a fresh optimizer and checks
 *     that its momentum is bitwise the single-device one.
 *
 * Exits 0 on success, 1 with a message on stderr otherwise. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/muonrt.h"

enum { kNumParams = 4, kSteps = 3 };

/* The model: global [rows, cols] and dtype per parameter. The shard sizes
 * over 4 ranks follow torch.chunk: 10 rows -> 3,3,3,1; 6 -> 2,2,2,0 (rank
 * 3 holds an empty shard); 8 -> 2 each; 7 -> 2,2,2,1. */
static const char* const kNames[kNumParams] = {"fc1.weight", "fc2.weight",
                                               "proj.weight", "emb.weight"};
static const int64_t kRows[kNumParams] = {10, 6, 8, 7};
static const int64_t kCols[kNumParams] = {6, 5, 12, 8};
static const int kDtype[kNumParams] = {MUONRT_FLOAT32, MUONRT_FLOAT32,
                                       MUONRT_FLOAT32, MUONRT_BFLOAT16};

static uint16_t ToBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* Initial value and step-`s` gradient of element `g` (global row-major
 * index) of parameter `p`. */
static float InitValue(int p, int64_t g) {
  return (float)(0.5 * sin(0.31 * (double)(g + 1) + 1.7 * p));
}
static float GradValue(int p, int s, int64_t g) {
  return (float)cos(0.13 * (double)(g + 1) * (s + 1) + 0.9 * p);
}

static void Store(void* base, int dtype, int64_t i, float v) {
  if (dtype == MUONRT_BFLOAT16) {
    ((uint16_t*)base)[i] = ToBf16(v);
  } else {
    ((float*)base)[i] = v;
  }
}

static int Fail(const char* what) {
  fprintf(stderr, "capi_rank_main: %s: %s\n", what, muonrt_last_error());
  return 1;
}

typedef struct {
  int64_t row0[kNumParams]; /* first global row held */
  int64_t rows[kNumParams]; /* local rows */
  void* data[kNumParams];   /* local shard */
  void* grad[kNumParams];   /* local gradient */
  int64_t shape[kNumParams][2];
  int64_t global[kNumParams][2];
  muonrt_param params[kNumParams];
} Shards;

/* torch.chunk of `n` rows into `parts`: chunk `index`. */
static void Chunk(int64_t n, int parts, int index, int64_t* begin,
                  int64_t* size) {
  const int64_t chunk = (n + parts - 1) / parts;
  int64_t b = chunk * index, e = chunk * (index + 1);
  if (b > n) b = n;
  if (e > n) e = n;
  *begin = b;
  *size = e - b;
}

static const char* const kShard0[1] = {"Shard(0)"};

static int MakeShards(Shards* s, int rank, int world, int distributed) {
  memset(s, 0, sizeof(*s));
  for (int p = 0; p < kNumParams; ++p) {
    Chunk(kRows[p], world, rank, &s->row0[p], &s->rows[p]);
    const int64_t n = s->rows[p] * kCols[p];
    const size_t elem = kDtype[p] == MUONRT_BFLOAT16 ? 2 : 4;
    s->data[p] = malloc(n > 0 ? (size_t)n * elem : 1);
    s->grad[p] = malloc(n > 0 ? (size_t)n * elem : 1);
    if (s->data[p] == NULL || s->grad[p] == NULL) return 0;
    for (int64_t i = 0; i < n; ++i) {
      Store(s->data[p], kDtype[p], i, InitValue(p, s->row0[p] * kCols[p] + i));
    }
    s->shape[p][0] = s->rows[p];
    s->shape[p][1] = kCols[p];
    s->global[p][0] = kRows[p];
    s->global[p][1] = kCols[p];
    muonrt_param* m = &s->params[p];
    m->name = kNames[p];
    m->data = s->data[p];
    m->grad = s->grad[p];
    m->dtype = kDtype[p];
    m->grad_dtype = kDtype[p];
    m->ndim = 2;
    m->local_shape = s->shape[p];
    m->strides = NULL;
    m->global_shape = distributed ? s->global[p] : NULL;
    m->placements = distributed ? kShard0 : NULL;
    m->sub_mesh = NULL;
    m->expert_stack = 0;
    m->row_splits = NULL;
    m->num_row_splits = 0;
    m->device_type = MUONRT_CPU;
    m->device_index = 0;
  }
  return 1;
}

static void FillGrads(Shards* s, int step) {
  for (int p = 0; p < kNumParams; ++p) {
    const int64_t n = s->rows[p] * kCols[p];
    for (int64_t i = 0; i < n; ++i) {
      Store(s->grad[p], kDtype[p], i,
            GradValue(p, step, s->row0[p] * kCols[p] + i));
    }
  }
}

static int WriteShards(const Shards* s, const char* path) {
  FILE* f = fopen(path, "wb");
  if (f == NULL) return 0;
  int ok = 1;
  for (int p = 0; p < kNumParams; ++p) {
    const size_t elem = kDtype[p] == MUONRT_BFLOAT16 ? 2 : 4;
    const size_t n = (size_t)(s->rows[p] * kCols[p]);
    if (n > 0 && fwrite(s->data[p], elem, n, f) != n) ok = 0;
  }
  if (fclose(f) != 0) ok = 0;
  return ok;
}

static void FreeShards(Shards* s) {
  for (int p = 0; p < kNumParams; ++p) {
    free(s->data[p]);
    free(s->grad[p]);
  }
}

static int RunSteps(muonrt_optimizer* opt, Shards* s) {
  for (int step = 0; step < kSteps; ++step) {
    FillGrads(s, step);
    if (muonrt_optimizer_step(opt, NULL) != MUONRT_OK) return Fail("step");
  }
  if (muonrt_optimizer_step_count(opt) != kSteps) {
    fprintf(stderr, "capi_rank_main: step count %lld, expected %d\n",
            (long long)muonrt_optimizer_step_count(opt), kSteps);
    return 1;
  }
  return 0;
}

/* How Distributed's last rank breaks the job, if it does. */
enum Break { kNoBreak = 0, kRenamed = 1, kBadDtype = 2, kCallerRefused = 3 };

/* The message the last rank of dist_caller_refused reports. */
static const char kCallerError[] = "the trainer's own check of rank";

/* dist_mismatch / dist_bad_dtype / dist_caller_refused (not on the
 * refusing rank): 3 when create failed as expected on this rank (`code`,
 * muonrt_last_error), else 1 with a message. */
static int ExpectCreateRefused(int mode, int rank, int world, int code) {
  const char* error = muonrt_last_error();
  const int peer_told =
      mode == kRenamed || rank == world - 1 ||
      (strstr(error, "could not create its optimizer") != NULL &&
       (mode != kCallerRefused || strstr(error, kCallerError) != NULL));
  if (code == MUONRT_INVALID_ARGUMENT && peer_told) {
    fprintf(stderr, "capi_rank_main: rank %d: expected error: %s\n", rank,
            error);
    return 3;
  }
  fprintf(stderr, "capi_rank_main: rank %d: create returned %d (%s)\n", rank,
          code, error);
  return 1;
}

static int Distributed(const char* out_dir, int mismatch) {
  muonrt_process_group* pg = NULL;
  muonrt_optimizer* opt = NULL;
  Shards s;
  char path[4096];
  int rc = 1;
  if (muonrt_pg_init_from_env(60, &pg) != MUONRT_OK) return Fail("pg init");
  const int rank = muonrt_pg_rank(pg), world = muonrt_pg_world_size(pg);
  const char* names[1] = {"dp_shard"};
  const int sizes[1] = {world};
  if (!MakeShards(&s, rank, world, 1)) {
    fprintf(stderr, "capi_rank_main: out of memory\n");
    goto done;
  }
  if (mismatch == kRenamed && rank == world - 1) {
    s.params[3].name = "emb.weight.renamed";
  }
  if (mismatch == kBadDtype && rank == world - 1) s.params[1].dtype = 5;
  if (mismatch == kCallerRefused && rank == world - 1) {
    if (muonrt_pg_report_create_failure(pg, kCallerError) != MUONRT_OK) {
      Fail("report_create_failure");
      goto done;
    }
    rc = 3;
    goto done;
  }
  const int code = muonrt_optimizer_create(pg, 1, names, sizes, s.params,
                                           kNumParams, NULL, &opt);
  if (mismatch != kNoBreak) {
    rc = ExpectCreateRefused(mismatch, rank, world, code);
    goto done;
  }
  if (code != MUONRT_OK) {
    Fail("create");
    goto done;
  }
  if (RunSteps(opt, &s) != 0) goto done;
  snprintf(path, sizeof(path), "%s/rank_%d.bin", out_dir, rank);
  if (!WriteShards(&s, path)) {
    fprintf(stderr, "capi_rank_main: cannot write %s\n", path);
    goto done;
  }
  snprintf(path, sizeof(path), "%s/ckpt", out_dir);
  if (muonrt_optimizer_save(opt, path) != MUONRT_OK) {
    Fail("save");
    goto done;
  }
  if (muonrt_pg_barrier(pg) != MUONRT_OK) {
    Fail("barrier");
    goto done;
  }
  rc = 0;
done:
  muonrt_optimizer_destroy(opt);
  muonrt_pg_destroy(pg);
  FreeShards(&s);
  return rc;
}

static int Single(const char* out_dir) {
  muonrt_optimizer *opt = NULL, *fresh = NULL;
  Shards s, t;
  char path[4096];
  int rc = 1;
  memset(&t, 0, sizeof(t));
  if (!MakeShards(&s, 0, 1, 0) || !MakeShards(&t, 0, 1, 0)) {
    fprintf(stderr, "capi_rank_main: out of memory\n");
    goto done;
  }
  if (muonrt_optimizer_create(NULL, 0, NULL, NULL, s.params, kNumParams, NULL,
                              &opt) != MUONRT_OK) {
    Fail("create");
    goto done;
  }
  if (RunSteps(opt, &s) != 0) goto done;
  snprintf(path, sizeof(path), "%s/single.bin", out_dir);
  if (!WriteShards(&s, path)) {
    fprintf(stderr, "capi_rank_main: cannot write %s\n", path);
    goto done;
  }
  /* The distributed checkpoint, resharded onto one device. */
  if (muonrt_optimizer_create(NULL, 0, NULL, NULL, t.params, kNumParams, NULL,
                              &fresh) != MUONRT_OK) {
    Fail("create (fresh)");
    goto done;
  }
  snprintf(path, sizeof(path), "%s/ckpt", out_dir);
  if (muonrt_optimizer_load(fresh, path) != MUONRT_OK) {
    Fail("load");
    goto done;
  }
  if (muonrt_optimizer_step_count(fresh) != kSteps) {
    fprintf(stderr, "capi_rank_main: loaded step count %lld\n",
            (long long)muonrt_optimizer_step_count(fresh));
    goto done;
  }
  for (int p = 0; p < kNumParams; ++p) {
    const float *a = NULL, *b = NULL;
    int64_t na = 0, nb = 0;
    if (muonrt_optimizer_momentum(opt, p, &a, &na) != MUONRT_OK ||
        muonrt_optimizer_momentum(fresh, p, &b, &nb) != MUONRT_OK) {
      Fail("momentum");
      goto done;
    }
    if (na != nb || memcmp(a, b, (size_t)na * sizeof(float)) != 0) {
      fprintf(stderr,
              "capi_rank_main: momentum of %s loaded from the distributed "
              "checkpoint differs from the single-device run\n",
              kNames[p]);
      goto done;
    }
  }
  rc = 0;
done:
  muonrt_optimizer_destroy(opt);
  muonrt_optimizer_destroy(fresh);
  FreeShards(&s);
  FreeShards(&t);
  return rc;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr,
            "usage: %s dist|dist_mismatch|dist_bad_dtype|"
            "dist_caller_refused|single OUT_DIR\n",
            argv[0]);
    return 2;
  }
  if (strcmp(argv[1], "dist") == 0) return Distributed(argv[2], kNoBreak);
  if (strcmp(argv[1], "dist_mismatch") == 0) {
    return Distributed(argv[2], kRenamed);
  }
  if (strcmp(argv[1], "dist_bad_dtype") == 0) {
    return Distributed(argv[2], kBadDtype);
  }
  if (strcmp(argv[1], "dist_caller_refused") == 0) {
    return Distributed(argv[2], kCallerRefused);
  }
  if (strcmp(argv[1], "single") == 0) return Single(argv[2]);
  fprintf(stderr, "capi_rank_main: unknown mode \"%s\"\n", argv[1]);
  return 2;
}
