/* muonrt: the C ABI of the distributed Muon runtime (libmuonrt.so).
 *
 * One header, plain C: opaque handles, an int status code per call (0 = OK,
 * otherwise an absl::StatusCode value: 3 INVALID_ARGUMENT, 5 NOT_FOUND,
 * 9 FAILED_PRECONDITION, 12 UNIMPLEMENTED, 13 INTERNAL, 14 UNAVAILABLE,
 * 15 DATA_LOSS, ...) and a message getter; no C++ types or exceptions cross
 * it. Used by the Python package `muonrt` through ctypes, so one build
 * serves every Python and PyTorch version.
 *
 * Lifecycle:
 *   muonrt_pg_init_from_env (or none: single device)
 *     -> muonrt_optimizer_create (joins the job: every rank of the process
 *        group calls it with its own views, collectively)
 *     -> [trainer fills grads; muonrt_optimizer_step]*  (collective)
 *     -> muonrt_optimizer_destroy -> muonrt_pg_destroy.
 * Tensors are views: the library reads gradients and writes parameters in
 * place through the pointers given (see client/tensor_view.h); it copies
 * nothing the caller owns except what the exchange needs.
 *
 * Thread-safety: a handle is used by one thread at a time. The last error
 * message is per thread.
 */
#ifndef MUONRT_H_
#define MUONRT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Incremented on any incompatible change of this header. */
#define MUONRT_ABI_VERSION 18

/* Status codes (absl::StatusCode values). */
#define MUONRT_OK 0
#define MUONRT_INVALID_ARGUMENT 3
#define MUONRT_DEADLINE_EXCEEDED 4
#define MUONRT_NOT_FOUND 5
#define MUONRT_OUT_OF_RANGE 11
#define MUONRT_FAILED_PRECONDITION 9
#define MUONRT_UNIMPLEMENTED 12
#define MUONRT_INTERNAL 13
#define MUONRT_UNAVAILABLE 14
#define MUONRT_DATA_LOSS 15

/* Element types (client/tensor_view.h DType). */
#define MUONRT_FLOAT32 0
#define MUONRT_BFLOAT16 1

/* Devices. */
#define MUONRT_CPU 0
#define MUONRT_CUDA 1

typedef struct muonrt_process_group muonrt_process_group;
typedef struct muonrt_optimizer muonrt_optimizer;

/* MUONRT_ABI_VERSION of the library. */
int muonrt_abi_version(void);

/* The message of the last failed call on this thread ("" after a
 * successful one). Valid until the next call on this thread. */
const char* muonrt_last_error(void);

/* ---- CPU kernels ---------------------------------------------------------
 * Threads the CPU Newton-Schulz runs on (>= 1): at first use,
 * MUONRT_NUM_THREADS (1 to 64), else the thread count of the library's
 * OpenBLAS (OPENBLAS_NUM_THREADS capped at the core count, else the core
 * count), after which OpenBLAS itself runs single-threaded and the library
 * splits each product's output into fixed 256 x 256 tiles over these
 * threads. Speed only: the results are the same bits for every count.
 * ABI version 10. */
int muonrt_compute_threads(void);

/* Sets the count above (1 to 64: OpenBLAS's own limit on calls in flight).
 * Errors: INVALID_ARGUMENT (names the value). ABI version 10. */
int muonrt_set_compute_threads(int threads);

/* The CPU kernel set the library's OpenBLAS runs, with its version and
 * build ("SkylakeX (OpenBLAS 0.3.21 DYNAMIC_ARCH ...)"): results are
 * bitwise the same across thread and rank counts for one kernel set, and
 * may differ in the last bits between kernel sets (OPENBLAS_CORETYPE).
 * Valid until the next call of it on this thread. ABI version 10. */
const char* muonrt_cpu_kernels(void);

/* ---- Process group ------------------------------------------------------
 * Joins the job described by torchrun's environment (RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT; MUON_COORDINATOR names a daemon instead of the
 * one rank 0 embeds on MASTER_ADDR:MASTER_PORT+1 (MUON_COORDINATOR_PORT);
 * MUON_JOB_ID (default empty: the coordinator's job); see
 * control/process_group.h ProcessGroupOptionsFromEnv). `timeout_s` bounds
 * rendezvous and every collective (<= 0: 60 s). Collective: every rank calls
 * it. Errors: INVALID_ARGUMENT (environment), UNAVAILABLE / DEADLINE_EXCEEDED
 * (peers or coordinator unreachable). */
int muonrt_pg_init_from_env(double timeout_s, muonrt_process_group** out);
/* The same with the data path's backend (torch.distributed's names):
 * "gloo" (CPU tensors; also for NULL) or "nccl" (CUDA tensors on CUDA
 * device `cuda_device`, an ordinal among the visible devices; < 0 =
 * LOCAL_RANK, torchrun's one GPU per local rank), which also joins a Gloo
 * group over the same ranks for the step's control values. Collective.
 * Errors: as muonrt_pg_init_from_env; INVALID_ARGUMENT (unknown backend);
 * UNIMPLEMENTED ("nccl" in a library built without CUDA);
 * FAILED_PRECONDITION (no such GPU). */
int muonrt_pg_init_backend_from_env(const char* backend, int cuda_device,
                                    double timeout_s,
                                    muonrt_process_group** out);
/* The job's key-value store, for handing over the embedded coordinator's
 * address (muonrt's Python package passes torch.distributed's default
 * store). `publish` stores the NUL-terminated "host:port" and returns 0
 * (non-zero: it failed). `lookup` waits up to `timeout_s` seconds for the
 * address rank 0 published and copies it, NUL-terminated, into `buf` of
 * `buf_size` bytes, returning 0 (non-zero: not published in time, or it
 * failed). Both are called with `ctx`, on the thread that called
 * muonrt_pg_init_with_store, before it returns. */
typedef int (*muonrt_publish_fn)(void* ctx, const char* address);
typedef int (*muonrt_lookup_fn)(void* ctx, double timeout_s, char* buf,
                                int buf_size);
/* muonrt_pg_init_backend_from_env, with rank 0's embedded coordinator on a
 * port the kernel picks (on MASTER_ADDR), its address published through
 * `publish` on rank 0 and found through `lookup` on the others, instead of
 * the fixed MASTER_PORT + 1 that another job may hold. MUON_COORDINATOR (a
 * daemon) and MUON_COORDINATOR_PORT (a fixed port) take precedence: the
 * store is then unused. Collective. ABI version 13.
 * Errors: as muonrt_pg_init_backend_from_env; INVALID_ARGUMENT (NULL
 * publish or lookup); DEADLINE_EXCEEDED (no address found in time);
 * UNAVAILABLE (publish failed). */
int muonrt_pg_init_with_store(const char* backend, int cuda_device,
                              double timeout_s, muonrt_publish_fn publish,
                              muonrt_lookup_fn lookup, void* ctx,
                              muonrt_process_group** out);
/* -1 (and the last error set) when pg is NULL. */
int muonrt_pg_rank(const muonrt_process_group* pg);
int muonrt_pg_world_size(const muonrt_process_group* pg);
/* host:port of the coordinator this rank talks to (rank 0's embedded one:
 * its bound port), for `muonctl --coordinator`; NULL (and the last error
 * set) when pg is NULL. Valid as long as pg. ABI version 13. */
const char* muonrt_pg_coordinator_address(const muonrt_process_group* pg);
/* Blocks until every rank got here (bounded by the timeout). */
int muonrt_pg_barrier(muonrt_process_group* pg);
/* This rank will not create its optimizer: a check of the caller's own
 * failed before muonrt_optimizer_create (which reports its own failures
 * itself). Tells the coordinator, so that the other ranks'
 * muonrt_optimizer_create fail at once with INVALID_ARGUMENT "rank R could
 * not create its optimizer: <message>" instead of waiting out their join
 * timeout; the job's generation then stays failed, as after manifests
 * that disagree. A world of one sends nothing (no peer waits). `message`:
 * UTF-8, read during the call; the coordinator keeps its first 4 KiB.
 * Best effort, one RPC bounded by the group's RPC deadline: 0 once tried,
 * whether or not the coordinator was reached. Errors: INVALID_ARGUMENT
 * (NULL pg or message). ABI version 18. */
int muonrt_pg_report_create_failure(muonrt_process_group* pg,
                                    const char* message);
/* NULL is a no-op. Destroy every optimizer of the group first. */
void muonrt_pg_destroy(muonrt_process_group* pg);

/* ---- Optimizer ----------------------------------------------------------- */

/* One parameter of this rank: a view of its local shard (DTensor's
 * to_local()) and gradient. Arrays are read during the call only. */
typedef struct {
  const char* name; /* unique, e.g. "layers.0.attn.wq.weight" */
  void* data;       /* local shard, `dtype` elements */
  const void* grad; /* same shape, `grad_dtype`; NULL = none yet */
  int dtype;        /* MUONRT_FLOAT32 | MUONRT_BFLOAT16 */
  int grad_dtype;
  int ndim;                    /* 2, or 3 with expert_stack */
  const int64_t* local_shape;  /* [ndim] */
  const int64_t* strides;      /* [ndim] in elements; NULL = contiguous */
  const int64_t* global_shape; /* [ndim]; NULL = local_shape */
  /* One placement per mesh dim in DTensor spelling ("Shard(0)",
   * "Replicate()"); NULL = Replicate() on every dim. */
  const char* const* placements;
  /* Ownership restriction, "pp=1" or "pp=1,ep=0"; NULL or "" = none. */
  const char* sub_mesh;
  int expert_stack; /* 1 = [experts, rows, cols] stack */
  int device_type;  /* MUONRT_CPU | MUONRT_CUDA */
  int device_index;
  /* Blocks of rows orthogonalized as matrices of their own (per-head
   * Newton-Schulz, fused QKV): num_row_splits sizes summing to the global
   * rows; NULL / 0 = the whole matrix (ParamView::row_splits). ABI
   * version 9. */
  const int64_t* row_splits;
  int num_row_splits;
} muonrt_param;

/* torch.optim.Muon's arguments and the runtime's execution options. */
typedef struct {
  double lr;                /* 1e-3 */
  double weight_decay;      /* 0.1 */
  double momentum;          /* 0.95 */
  int nesterov;             /* 1 */
  double ns_a, ns_b, ns_c;  /* 3.4445, -4.7750, 2.0315 */
  double eps;               /* 1e-7 */
  int ns_steps;             /* 5 */
  const char* adjust_lr_fn; /* "original" | "match_rms_adamw" | "spectral_norm";
                               NULL = original */
  const char* ns_schedule;  /* "quintic" | "polar_express"; NULL = quintic */
  int async_gpu_parallelism;     /* 0 = sequential debug mode */
  int prefetch_count;            /* 0 */
  const char* assignment_policy; /* "lpt" | "round_robin"; NULL = lpt */
  int64_t bucket_size_bytes;     /* 0 = one matrix per owner per bucket */
  /* 1 = all-or-nothing steps (MuonOptions::transactional_step): a step
   * that fails on any rank leaves every rank's parameters, momentum and
   * step count bitwise as before it. Costs sum(local_numel * (dtype bytes
   * + momentum dtype bytes)) + 8 bytes of the parameters' device memory
   * per rank and one one-float all-gather per step. 0 (default) or 1. */
  int transactional_step;
  /* Re-plan from measured Newton-Schulz times every this many steps (0 =
   * never, the default; needs a coordinator): the slow ranks get fewer
   * matrices, results stay bitwise the same (execution.replan_every_steps;
   * ABI version 3). */
  int replan_every_steps;
  /* Newton-Schulz method: "standard" (NULL), "gram" (iterate on the
   * m x m Gram matrix) or "auto" (per matrix, whichever executes fewer
   * FLOPs; on CUDA parameters, cuBLAS GEMMs for every product: gram
   * once the long side exceeds 1.5 times the short one);
   * MuonOptions::ns_method; ABI version 4 (CUDA: version 10). */
  const char* ns_method;
  /* The dtype the exchange between ranks carries: "float32" (NULL; the
   * single device's bits) or "bfloat16" (half the bytes; Newton-Schulz's
   * input and output rounded to nearest even bf16, the same bits on every
   * layout); execution.exchange_dtype; ABI version 8. */
  const char* exchange_dtype;
  /* NorMuon (MuonOptions::normuon; arXiv 2510.05491, microsoft/dion): 0
   * (default) or 1: Newton-Schulz's output normalized per row by a second
   * moment (decay normuon_beta2 in [0, 1), default 0.95; floor
   * normuon_eps > 0, default 1e-8) and rescaled to its Frobenius norm.
   * CPU parameters, float32 exchange. ABI version 9. */
  int normuon;
  double normuon_beta2;
  double normuon_eps;
  /* 1 = start the step during backward (execution.overlap_backward):
   * buckets ordered last matrix first (25 MiB each unless
   * bucket_size_bytes says), muonrt_optimizer_mark_ready hands ready
   * buckets to the exchange. The non-finite gradient check is then off
   * unless check_finite says 1 (then a snapshot of parameters and
   * momentum undoes a step with a NaN/Inf gradient); it cannot run with
   * transactional_step. ABI version 9. */
  int overlap_backward;
  /* The momentum buffer's dtype (MuonOptions::momentum_dtype): "param"
   * (NULL; each parameter's own, as torch.optim.Muon keeps it: 2 bytes
   * per parameter for bf16), "float32" (4 bytes; a bf16 parameter's
   * momentum keeps the low bits of small increments) or "bfloat16".
   * ABI version 11. */
  const char* momentum_dtype;
  /* The non-finite gradient check (MuonOptions::check_finite): -1
   * (default) on, except with overlap_backward; 1 on (with
   * overlap_backward: a snapshot undoes a bad step); 0 off (NaN/Inf
   * propagate as in torch.optim.Muon).
   * Start from muonrt_options_default: a zero-filled struct turns the
   * check off (and sets lr 0). ABI version 12. */
  int check_finite;
  /* The element type of Newton-Schulz on CUDA parameters
   * (execution.gpu_precision): "bf16" (NULL; bf16 storage, fp32
   * accumulation, as torch.optim.Muon's bf16 iteration), "tf32" or "fp32"
   * (fp32 storage and compute: the same bits on every layout, ranks
   * sharing a GPU included). CPU parameters run in fp32 either way.
   * ABI version 15. */
  const char* gpu_precision;
} muonrt_options;

/* Fills `options` with the defaults above. */
void muonrt_options_default(muonrt_options* options);

/* Checks `options` without creating anything: torch.optim.Muon's argument
 * checks (its messages: "Learning rate should be >= 0 but is: -0.1", ...),
 * the schedule, method and device names, the execution options
 * (negative counts, unknown policy) and the options against each other as
 * for CPU parameters (muon::ResolveOptions: overlap_backward with
 * transactional_step, normuon with the bf16 exchange).
 * muonrt_optimizer_create runs the same checks. Errors: INVALID_ARGUMENT naming
 * the field and value. ABI version 7. */
int muonrt_options_validate(const muonrt_options* options);

/* Creates the optimizer over `num_params` views. `pg` NULL = single device
 * (mesh, placements and sub_mesh ignored). `options` NULL = defaults.
 * With a process group: the mesh has `mesh_ndim` named dims (row-major;
 * product = world size), each param's placements one per dim. Collective
 * over the group (joins the job, agrees on the plan).
 * Errors: INVALID_ARGUMENT naming the parameter and value (torch's
 * argument errors, not 2-D, non-contiguous, placements, manifests that
 * disagree), UNIMPLEMENTED (CUDA views), UNAVAILABLE / DEADLINE_EXCEEDED. */
int muonrt_optimizer_create(muonrt_process_group* pg, int mesh_ndim,
                            const char* const* mesh_names,
                            const int* mesh_sizes, const muonrt_param* params,
                            int num_params, const muonrt_options* options,
                            muonrt_optimizer** out);
/* NULL is a no-op. */
void muonrt_optimizer_destroy(muonrt_optimizer* opt);

/* One step over every parameter (collective), ordered on `stream`: the
 * caller's stream of the parameters' device (a cudaStream_t, e.g.
 * torch.cuda.current_stream().cuda_stream), or NULL for CPU parameters
 * (the step then runs before the call returns). ABI version 5 added
 * `stream`. Errors: INVALID_ARGUMENT (a stream for CPU parameters);
 * FAILED_PRECONDITION (a missing gradient, before any collective, nothing
 * modified); communicator errors. */
int muonrt_optimizer_step(muonrt_optimizer* opt, void* stream);

/* The caller's own checks of this step's inputs failed on this rank
 * (`reason`, NUL-terminated, for the message): instead of
 * muonrt_optimizer_step, takes this rank's part in the step's agreement as
 * a refusal, so that every other rank's step fails at once naming this
 * rank, with nothing modified on any rank (with overlap_backward: this
 * rank's failure, which the coordinator makes the job error when the
 * world is larger than one; during a step begun by mark_ready it is
 * refused, and muonrt_optimizer_step finishes that step). Returns
 * FAILED_PRECONDITION with `reason` (or the agreement's error);
 * INVALID_ARGUMENT for a NULL argument. Collective where muonrt_optimizer_step
 * is. ABI version 17. */
int muonrt_optimizer_refuse_step(muonrt_optimizer* opt, const char* reason);

/* Re-binds parameter `index`'s gradient pointer (same dtype and shape);
 * NULL = none. Errors: OUT_OF_RANGE. */
int muonrt_optimizer_set_grad(muonrt_optimizer* opt, int index,
                              const void* grad);

/* Parameter `index`'s lr, weight decay and momentum from the next step on
 * (param groups; schedulers such as OneCycleLR set lr and momentum).
 * Errors: OUT_OF_RANGE, INVALID_ARGUMENT (torch's messages, naming the
 * parameter), FAILED_PRECONDITION during a step begun by mark_ready.
 * ABI version 17 added momentum. */
int muonrt_optimizer_set_hyperparameters(muonrt_optimizer* opt, int index,
                                         double lr, double weight_decay,
                                         double momentum);

/* ---- State ------------------------------------------------------------ */

/* Steps taken; -1 (and the last error set) when opt is NULL. */
int64_t muonrt_optimizer_step_count(const muonrt_optimizer* opt);

/* Parameter `index`'s momentum buffer: a host copy of the library's fp32
 * local shard (copied from the parameters' device by this call), row-major,
 * `*numel` elements (for state_dict()), read-only (write it through
 * muonrt_optimizer_load_state). The pointer stays valid until the optimizer
 * is destroyed; the values are those of this call's time (call again after
 * step, load_state or load). Errors: OUT_OF_RANGE; INTERNAL (the copy from
 * a CUDA device failed); FAILED_PRECONDITION during a step begun by
 * mark_ready (the step is writing it). */
int muonrt_optimizer_momentum(muonrt_optimizer* opt, int index,
                              const float** data, int64_t* numel);

/* Sets the step count and every momentum buffer at once
 * (load_state_dict): buffers[i] holds numels[i] fp32 values for parameter
 * i; `step` in [0, 2^62]. Every check comes before any write: on a
 * check's error nothing changed. Errors: INVALID_ARGUMENT (count or size
 * mismatch, naming the parameter; a step out of range),
 * FAILED_PRECONDITION during a step begun by mark_ready, INTERNAL (a row
 * state kept unchanged could not be read from the device; or a copy to a
 * CUDA device failed midway, naming the parameter: the buffers of the
 * parameters before it are loaded, the step count is not). */
int muonrt_optimizer_load_state(muonrt_optimizer* opt, int64_t step,
                                const float* const* buffers,
                                const int64_t* numels, int num_params);

/* The name of the optimizer's per-row state, its key in torch's
 * state_dict: "variance_neuron" with NorMuon (microsoft/dion's name), ""
 * without a variant. `*name` is owned by `opt` and valid until it is
 * destroyed. Errors: INVALID_ARGUMENT (a NULL argument). ABI version 14. */
int muonrt_optimizer_row_state_name(muonrt_optimizer* opt, const char** name);

/* Parameter `index`'s row state of the owner-side variant (NorMuon's
 * second moment): a host copy of one fp32 per local row ([local experts *
 * local rows]), `*numel` elements (0 without a variant), valid as
 * muonrt_optimizer_momentum's. Errors: OUT_OF_RANGE; INTERNAL (the copy
 * failed); FAILED_PRECONDITION as muonrt_optimizer_momentum. ABI version 14
 * (muonrt_optimizer_variance_neuron before). */
int muonrt_optimizer_row_state(muonrt_optimizer* opt, int index,
                               const float** data, int64_t* numel);

/* muonrt_optimizer_load_state plus NorMuon's row states: row_states[i]
 * holds row_state_numels[i] fp32 values for parameter i (as
 * muonrt_optimizer_row_state gives them); `row_states` and
 * `row_state_numels` NULL = every row state unchanged. Errors: as
 * muonrt_optimizer_load_state (every check before any write). ABI version
 * 9. */
int muonrt_optimizer_load_full_state(muonrt_optimizer* opt, int64_t step,
                                     const float* const* buffers,
                                     const int64_t* numels,
                                     const float* const* row_states,
                                     const int64_t* row_state_numels,
                                     int num_params);

/* Marks parameter `index`'s gradient final for the coming step (options
 * .overlap_backward; Muon::MarkReadyOnStream): its momentum runs now,
 * ordered on `stream` (the cudaStream_t that produced the gradient, e.g.
 * torch.cuda.current_stream().cuda_stream in a post-accumulate-grad hook;
 * NULL = the legacy default stream; NULL for CPU parameters, whose
 * momentum runs before the call returns; optimizer creation refuses
 * overlap_backward with CUDA parameters in this version),
 * and every bucket whose parameters are all ready starts its exchange and
 * Newton-Schulz on the optimizer's streams, after that work;
 * muonrt_optimizer_step finishes the rest. The gradient must not change
 * afterwards in this step.
 * Errors: OUT_OF_RANGE; FAILED_PRECONDITION (overlap_backward off, marked
 * twice, no gradient); INVALID_ARGUMENT (a stream for CPU parameters).
 * ABI version 9; `stream` since ABI version 16. */
int muonrt_optimizer_mark_ready(muonrt_optimizer* opt, int index, void* stream);

/* ---- QK-clip (MuonClip) ------------------------------------------------ */

/* One attention layer: query head h is rows [q_row_begin + h * head_dim,
 * + head_dim) of parameter q_param, key head g rows [k_row_begin + g *
 * head_dim, + head_dim) of k_param (the same name for a fused q | k | v
 * projection); query heads h / (num_heads / num_kv_heads) == g share key
 * head g (num_kv_heads 0 = num_heads). */
typedef struct {
  const char* q_param;
  int64_t q_row_begin;
  const char* k_param;
  int64_t k_row_begin;
  int num_heads;
  int num_kv_heads;
  int64_t head_dim;
  /* Rows per key head (0 = head_dim), and MLA's rotary rows at the end of
   * each query head (0 = not MLA; scaled by gamma, the shared rotary key
   * untouched: the Kimi K2 report's MLA rule). */
  int64_t k_head_dim;
  int64_t q_rope_dim;
} muonrt_qk_clip_layer;

/* Sets QK-clip's layers (num_layers 0 = off), threshold tau (> 0; the Kimi
 * K2 report's 100) and alpha (the query's share of the scale, in [0, 1];
 * 0.5). Local, all or nothing. Errors: INVALID_ARGUMENT naming the layer,
 * field or parameter (unknown, not 2-D, too few rows), or layers with CUDA
 * parameters (not yet run on a GPU in this version). ABI version 9. */
int muonrt_optimizer_set_qk_clip(muonrt_optimizer* opt, double threshold,
                                 double alpha,
                                 const muonrt_qk_clip_layer* layers,
                                 int num_layers);

/* QK-clip after a step (Muon::ClipQkOnStream; collective): max_logits
 * (host memory) holds this rank's largest pre-softmax logit per query head
 * (layers in order, `count` = their heads in all; -inf for a head not
 * computed here); the ranks' MAX decides which groups clip; every rank
 * scales its own rows, ordered on `stream` (the parameters' cudaStream_t,
 * as muonrt_optimizer_step's; NULL for CPU parameters, scaled before the
 * call returns). *groups_clipped and *max_logit (either may be NULL)
 * report it. Errors: INVALID_ARGUMENT on every rank naming the rank with a
 * bad count or a NaN (nothing scaled); INVALID_ARGUMENT (a stream for CPU
 * parameters); FAILED_PRECONDITION (no layers). ABI version 9; `stream`
 * since ABI version 16. */
int muonrt_optimizer_clip_qk(muonrt_optimizer* opt, const float* max_logits,
                             int64_t count, int64_t* groups_clipped,
                             float* max_logit, void* stream);

/* Muon::Save / Muon::Load: one safetensors file per rank plus
 * metadata.json in `dir`; Load reshards from any saved layout. Errors:
 * those of checkpoint/checkpoint.h, naming the file and parameter;
 * FAILED_PRECONDITION during a step begun by mark_ready, and for a
 * checkpoint holding a variant's row state this optimizer does not keep
 * (NorMuon's into one without normuon). */
int muonrt_optimizer_save(muonrt_optimizer* opt, const char* dir);
int muonrt_optimizer_load(muonrt_optimizer* opt, const char* dir);

/* ---- Plan and statistics ------------------------------------------------ */

/* Writes a NUL-terminated JSON text into buf (capacity `cap` bytes) and
 * its length (without the NUL) into *len. When cap is too small, writes
 * nothing but *len and returns OUT_OF_RANGE: call again with *len + 1. */
/* The plan (protobuf JSON mapping of muon.v1.Plan, compact, with the
 * .proto's field names: "world_size", "max_load_flops", not lowerCamelCase;
 * fields at their default value are omitted). */
int muonrt_optimizer_plan_json(const muonrt_optimizer* opt, char* buf,
                               size_t cap, size_t* len);
/* This rank's view of the assignments: {"<rank>": [matrix indices], ...}
 * (Muon::assignments()). */
int muonrt_optimizer_assignments_json(const muonrt_optimizer* opt, char* buf,
                                      size_t cap, size_t* len);
/* The last step on this rank as the muon.v1.StepReport a rank sends its
 * coordinator, in protobuf's JSON mapping (proto field names): counters
 * and "ops", one per operation (gather, orthogonalize, redistribute,
 * apply) with its bucket, stream, start_s and end_s in seconds since the
 * Unix epoch (CUDA tensors: the device times of CUDA events around each
 * operation's work) (Muon::FillStepReport). Buffer as the other *_json
 * calls. ABI version 10. */
int muonrt_optimizer_last_step_report_json(const muonrt_optimizer* opt,
                                           char* buf, size_t cap, size_t* len);

/* Counters of the last step on this rank. */
typedef struct {
  int64_t step; /* steps taken */
  int32_t matrices_orthogonalized;
  double ns_flops;    /* Newton-Schulz FLOPs */
  int64_t bytes_sent; /* fp32 payload sent to other ranks */
  int64_t bytes_received;
  double step_time_s;   /* seconds inside the last step */
  int64_t buffer_bytes; /* preallocated exchange buffers */
} muonrt_step_stats;
int muonrt_optimizer_last_step_stats(const muonrt_optimizer* opt,
                                     muonrt_step_stats* stats);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MUONRT_H_ */
