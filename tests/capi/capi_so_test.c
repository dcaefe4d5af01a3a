/* libmuonrt.so as a ctypes binding sees it: loaded with dlopen
 * (RTLD_LOCAL), every entry point of capi/muonrt.h resolves with the
 * header's prototype, library internals are not exported (muonrt.lds),
 * and a single-device step and an error go through it.
 *
 * Usage: capi_so_test PATH/TO/libmuonrt.so */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "capi/muonrt.h"

static void* g_lib = NULL;
static int g_failed = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      g_failed = 1;                                                            \
      return 1;                                                                \
    }                                                                          \
  } while (0)

/* The symbol `name` typed as the header declares it. */
#define SYM(name) ((__typeof__(&name))dlsym(g_lib, #name))

static const char* const kEntryPoints[] = {
    "muonrt_abi_version",
    "muonrt_last_error",
    "muonrt_compute_threads",
    "muonrt_set_compute_threads",
    "muonrt_cpu_kernels",
    "muonrt_pg_init_from_env",
    "muonrt_pg_init_backend_from_env",
    "muonrt_pg_rank",
    "muonrt_pg_world_size",
    "muonrt_pg_barrier",
    "muonrt_pg_report_create_failure",
    "muonrt_pg_destroy",
    "muonrt_options_default",
    "muonrt_optimizer_create",
    "muonrt_optimizer_destroy",
    "muonrt_optimizer_step",
    "muonrt_optimizer_set_grad",
    "muonrt_optimizer_refuse_step",
    "muonrt_optimizer_set_hyperparameters",
    "muonrt_optimizer_step_count",
    "muonrt_optimizer_momentum",
    "muonrt_optimizer_load_state",
    "muonrt_optimizer_save",
    "muonrt_optimizer_load",
    "muonrt_optimizer_plan_json",
    "muonrt_optimizer_assignments_json",
    "muonrt_optimizer_last_step_report_json",
    "muonrt_optimizer_last_step_stats",
};

static int Run(void) {
  for (size_t i = 0; i < sizeof(kEntryPoints) / sizeof(kEntryPoints[0]); ++i) {
    if (dlsym(g_lib, kEntryPoints[i]) == NULL) {
      fprintf(stderr, "%s is not exported\n", kEntryPoints[i]);
      CHECK(0);
    }
  }
  /* Internals stay local: muon::Muon::Step() and the placement parser. */
  CHECK(dlsym(g_lib, "_ZN4muon4Muon4StepEv") == NULL);
  CHECK(dlsym(g_lib,
              "_ZN4muon9Placement5ParseESt17basic_string_viewIcSt11char_"
              "traitsIcEE") == NULL);

  CHECK(SYM(muonrt_abi_version)() == MUONRT_ABI_VERSION);
  muonrt_options options;
  SYM(muonrt_options_default)(&options);
  options.lr = 0.05;
  float w[12], g[12], w0[12];
  for (int i = 0; i < 12; ++i) {
    w[i] = 0.1f * (float)(i % 5) - 0.2f;
    g[i] = 0.3f * (float)((i * 7) % 11) - 1.0f;
  }
  memcpy(w0, w, sizeof(w));
  const int64_t shape[2] = {3, 4};
  muonrt_param p;
  memset(&p, 0, sizeof(p));
  p.name = "w";
  p.data = w;
  p.grad = g;
  p.dtype = MUONRT_FLOAT32;
  p.grad_dtype = MUONRT_FLOAT32;
  p.ndim = 2;
  p.local_shape = shape;
  p.device_type = MUONRT_CPU;
  muonrt_optimizer* opt = NULL;
  CHECK(SYM(muonrt_optimizer_create)(NULL, 0, NULL, NULL, &p, 1, &options,
                                     &opt) == MUONRT_OK);
  CHECK(SYM(muonrt_optimizer_step)(opt, NULL) == MUONRT_OK);
  CHECK(strcmp(SYM(muonrt_last_error)(), "") == 0);
  CHECK(SYM(muonrt_optimizer_step_count)(opt) == 1);
  CHECK(memcmp(w, w0, sizeof(w)) != 0);
  SYM(muonrt_optimizer_destroy)(opt);
  /* An error crosses as a code and a message. */
  p.name = NULL;
  opt = NULL;
  CHECK(SYM(muonrt_optimizer_create)(NULL, 0, NULL, NULL, &p, 1, &options,
                                     &opt) == MUONRT_INVALID_ARGUMENT);
  CHECK(opt == NULL);
  CHECK(strstr(SYM(muonrt_last_error)(), "name is NULL") != NULL);
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s PATH/TO/libmuonrt.so\n", argv[0]);
    return 2;
  }
  g_lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (g_lib == NULL) {
    fprintf(stderr, "dlopen(%s): %s\n", argv[1], dlerror());
    return 1;
  }
  Run();
  /* No dlclose: the library's static state (gRPC, OpenBLAS threads) lives
   * until exit, as in a Python process. */
  printf(g_failed ? "capi_so_test: FAILED\n" : "capi_so_test: OK\n");
  return g_failed;
}
