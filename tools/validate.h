// `muonctl validate` (baseline, distributed run and comparison in one command):
// runs K Muon steps on as many local rank processes as the spec's mesh holds,
// the same K steps on a single device, and compares the final parameters.
#ifndef MUON_TOOLS_VALIDATE_H_
#define MUON_TOOLS_VALIDATE_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace muon {

// Limits of a local check, checked before any rank process is forked: the
// mesh's world size (one process per rank) and the elements of all
// parameters together (full fp32 copies are held in one process).
inline constexpr int kMaxValidateRanks = 256;
inline constexpr int64_t kMaxValidateElements = int64_t{1} << 28;

// Parameter files (--init, --grads, --dump) are named
// NpyFileName(parameter name) + ".npy" (tools/npy.h): every byte outside
// [A-Za-z0-9_.-] is written %XX, so no name ("../../x", "/abs", "a/b")
// reaches outside its folder.
struct ValidateOptions {
  std::string spec_path;
  int steps = 3;
  // Initial parameters DIR/<param>.npy; empty = seeded synthetic values.
  std::string init_dir;
  // Gradients DIR/<step>/<param>.npy (step from 0); empty = seeded.
  std::string grads_dir;
  // Writes DIR/distributed/<param>.npy and DIR/single/<param>.npy (and,
  // with checkpoint_at, keeps the checkpoint in DIR/checkpoint).
  std::string dump_dir;
  uint64_t seed = 0;
  // host:port of a running muon-coordinator; empty = embedded in rank 0.
  std::string coordinator;
  // Largest accepted |distributed - single| (0 = bitwise equal).
  double tolerance = 0.0;
  // Bound on the whole distributed run.
  int timeout_s = 600;
  // > 0: run to step J = checkpoint_at, save a checkpoint (the optimizer's
  // Muon::Save and the parameters' shards, both safetensors per rank), load
  // it in fresh rank processes (of resume_spec_path's layout and world
  // size when set) and continue to `steps`; the result must still equal the
  // uninterrupted single-device run.
  int checkpoint_at = 0;
  // Job spec of the resumed run: same parameters (names, shapes, order),
  // any mesh and placements. Empty = spec_path.
  std::string resume_spec_path;
  // The steps [phase_from, phase_to) one validate-rank process runs
  // (phase_to < 0: `steps`), the checkpoint it resumes from and the one it
  // writes (set by RunValidate for its rank processes).
  int64_t phase_from = 0;
  int64_t phase_to = -1;
  std::string load_dir;
  std::string save_dir;
};

// Runs the check and prints a table (parameter, global shape, max abs
// difference) and a summary line to `out`.
// Errors: InvalidArgument (bad spec or files, naming them; a mesh of more
// than kMaxValidateRanks ranks or more than kMaxValidateElements elements,
// before anything is forked); Aborted when a
// rank process failed (its stderr is passed through); DataLoss when the
// results differ by more than the tolerance or the zero-redundancy counts
// do not add up.
absl::Status RunValidate(const ValidateOptions& options, std::ostream& out);

// The body of one rank process (`muonctl validate-rank`, started by
// RunValidate): joins the job, runs the steps, writes its shards and counts
// under out_dir.
absl::Status RunValidateRank(const ValidateOptions& options, int rank,
                             const std::string& out_dir,
                             const std::string& port_file);

}  // namespace muon

#endif  // MUON_TOOLS_VALIDATE_H_
