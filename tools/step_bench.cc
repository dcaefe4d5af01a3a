// step_bench: optimizer step time of a realistic layer set at 4 ranks (FSDP,
// Gloo on loopback, ranks as threads of this process), in sequential debug
// mode and in async mode with prefetch 0, 1 and 2, with the step executor's
// preallocated buffers per rank next to their bound. Not a test: numbers.
//
// Ends with one line:
//   step-bench: sequential_ms=... async_ms=... speedup=...
// (async with the best prefetch; speedup = sequential / async).
#include <cblas.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "comm/gloo_communicator.h"
#include "common/layout.h"
#include "common/status_macros.h"
#include "server/coordinator_service.h"
#include "server/local_coordination_client.h"

ABSL_FLAG(int, ranks, 4,
          "Ranks (threads, each with its own Gloo process group).");
ABSL_FLAG(int, d_model, 256,
          "Transformer width; MLP hidden = 2.6875 x d_model.");
ABSL_FLAG(int, layers, 4,
          "Transformer layers (q, k, v, o, gate, up, down each).");
ABSL_FLAG(int, warmup, 2, "Untimed steps per mode.");
ABSL_FLAG(int, steps, 5, "Timed steps per mode (median reported).");
ABSL_FLAG(int64_t, bucket_size_bytes, 0,
          "Bucket size (0 = one matrix per owner).");

namespace muon {
namespace {

struct Shape {
  std::string name;
  int64_t rows, cols;
};

std::vector<Shape> LayerSet(int d, int layers) {
  const int64_t h = static_cast<int64_t>(d * 2.6875);
  std::vector<Shape> out;
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    for (const char* n : {"attn.q", "attn.k", "attn.v", "attn.o"}) {
      out.push_back({p + n, d, d});
    }
    out.push_back({p + "mlp.gate", h, d});
    out.push_back({p + "mlp.up", h, d});
    out.push_back({p + "mlp.down", d, h});
  }
  return out;
}

struct Result {
  double median_ms = 0;
  int64_t buffer_bytes = 0;
  int64_t buffer_bound_bytes = 0;
  int64_t plan_buckets = 0;
};

// This rank's shards of `shapes` under FSDP Shard(0) on `mesh`: fixed
// data, a deterministic gradient pattern.
std::vector<Parameter> RankParams(const std::vector<Shape>& shapes,
                                  const Mesh& mesh, int rank) {
  std::vector<Parameter> params(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    absl::StatusOr<Box> box =
        LocalBox(shapes[i].rows, shapes[i].cols, {Placement::Shard(0)}, mesh,
                 mesh.Coord(rank));
    Parameter& p = params[i];
    p.name = shapes[i].name;
    p.global_shape = {shapes[i].rows, shapes[i].cols};
    p.local_shape = {box->rows.size(), box->cols.size()};
    p.data.assign(box->numel(), 0.01f);
    p.grad.resize(box->numel());
    for (int64_t k = 0; k < box->numel(); ++k) {
      p.grad[k] =
          static_cast<float>((k * 2654435761u + i) % 1000) * 1e-3f - 0.5f;
    }
  }
  return params;
}

// One rank of RunMode: its Gloo group, optimizer and timed steps (ms, after
// the warmup) into *times; its buffers and bucket count into *result.
absl::Status RunRank(int rank, int world, CoordinationClient* client,
                     const std::vector<Shape>& shapes, bool async, int prefetch,
                     std::vector<double>* times, Result* result) {
  GlooOptions go;
  go.prefix = "gloo/bench";
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                        GlooCommunicator::Create(rank, world, client, go));
  std::vector<Parameter> params =
      RankParams(shapes, Mesh{{"dp_shard"}, {world}}, rank);
  std::vector<Parameter*> ptrs;
  for (Parameter& p : params) ptrs.push_back(&p);
  AutoConfigOptions ao;
  ao.fsdp = comm.get();
  ao.coordinator = client;
  MUON_ASSIGN_OR_RETURN(DistributedConfig config, CreateAutoConfig(ptrs, ao));
  config.execution.set_async_gpu_parallelism(async);
  config.execution.set_prefetch_count(prefetch);
  config.execution.set_bucket_size_bytes(
      absl::GetFlag(FLAGS_bucket_size_bytes));
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<Muon> opt,
                        Muon::Create(ptrs, MuonOptions{}, config));
  const int total = absl::GetFlag(FLAGS_warmup) + absl::GetFlag(FLAGS_steps);
  for (int s = 0; s < total; ++s) {
    const absl::Time t0 = absl::Now();
    MUON_RETURN_IF_ERROR(opt->Step());
    if (s >= absl::GetFlag(FLAGS_warmup)) {
      times->push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    }
  }
  result->buffer_bytes = opt->last_step_stats().buffer_bytes;
  result->buffer_bound_bytes = opt->last_step_stats().buffer_bound_bytes;
  result->plan_buckets = opt->plan().buckets_size();
  (void)comm->Barrier();
  return absl::OkStatus();
}

// Runs warmup + steps optimizer steps on every rank; returns the median of
// rank 0's step times (every step ends with the same collectives on every
// rank, so rank 0's time is the world's).
Result RunMode(const std::vector<Shape>& shapes, bool async, int prefetch) {
  const int world = absl::GetFlag(FLAGS_ranks);
  CoordinatorService::Options so;
  so.job_id = "step-bench";
  so.world_size = world;
  CoordinatorService service(so);
  std::vector<std::unique_ptr<LocalCoordinationClient>> clients;
  for (int r = 0; r < world; ++r) {
    clients.push_back(std::make_unique<LocalCoordinationClient>(&service));
  }
  std::vector<std::vector<double>> times(world);
  std::vector<Result> results(world);
  std::vector<absl::Status> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      errors[rank] = RunRank(rank, world, clients[rank].get(), shapes, async,
                             prefetch, &times[rank], &results[rank]);
    });
  }
  for (std::thread& t : threads) t.join();
  service.Shutdown();
  for (int r = 0; r < world; ++r) {
    if (!errors[r].ok()) {
      std::fprintf(stderr, "step_bench: rank %d: %s\n", r,
                   errors[r].ToString().c_str());
      std::exit(1);
    }
  }
  Result out;
  std::vector<double> t = times[0];
  std::sort(t.begin(), t.end());
  out.median_ms = t[t.size() / 2];
  for (const Result& r : results) {
    out.buffer_bytes = std::max(out.buffer_bytes, r.buffer_bytes);
    out.buffer_bound_bytes =
        std::max(out.buffer_bound_bytes, r.buffer_bound_bytes);
  }
  out.plan_buckets = results[0].plan_buckets;
  return out;
}

long MaxRssKiB() {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

}  // namespace
}  // namespace muon

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  openblas_set_num_threads(1);
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  const std::vector<muon::Shape> shapes =
      muon::LayerSet(absl::GetFlag(FLAGS_d_model), absl::GetFlag(FLAGS_layers));
  double flops = 0;
  for (const auto& s : shapes) {
    const double m = std::min(s.rows, s.cols), n = std::max(s.rows, s.cols);
    flops += 5 * (4 * m * m * n + 2 * m * m * m);
  }
  std::printf(
      "step_bench: %zu matrices (d_model %d, %d layers), %.2f NS GFLOP/step, "
      "%d ranks FSDP on Gloo/loopback (threads), OpenBLAS %s x1 thread/rank "
      "(OPENBLAS_CORETYPE=%s), %u hardware threads\n",
      shapes.size(), absl::GetFlag(FLAGS_d_model), absl::GetFlag(FLAGS_layers),
      flops / 1e9, absl::GetFlag(FLAGS_ranks), openblas_get_corename(),
      coretype != nullptr ? coretype : "(unset)",
      std::thread::hardware_concurrency());
  std::printf("%-22s %9s %8s %16s %16s %12s\n", "mode", "step ms", "buckets",
              "buffers/rank MiB", "bound/rank MiB", "max RSS MiB");
  const muon::Result seq = muon::RunMode(shapes, /*async=*/false, 0);
  std::printf("%-22s %9.1f %8lld %16.2f %16.2f %12.1f\n", "sequential (debug)",
              seq.median_ms, static_cast<long long>(seq.plan_buckets),
              seq.buffer_bytes / 1048576.0, seq.buffer_bound_bytes / 1048576.0,
              muon::MaxRssKiB() / 1024.0);
  double best = 1e300;
  int best_p = 0;
  for (int p : {0, 1, 2}) {
    const muon::Result r = muon::RunMode(shapes, /*async=*/true, p);
    std::printf("%-22s %9.1f %8lld %16.2f %16.2f %12.1f\n",
                absl::StrCat("async prefetch ", p).c_str(), r.median_ms,
                static_cast<long long>(r.plan_buckets),
                r.buffer_bytes / 1048576.0, r.buffer_bound_bytes / 1048576.0,
                muon::MaxRssKiB() / 1024.0);
    if (r.median_ms < best) {
      best = r.median_ms;
      best_p = p;
    }
  }
  std::printf(
      "step-bench: sequential_ms=%.1f async_ms=%.1f speedup=%.2f (async "
      "prefetch %d)\n",
      seq.median_ms, best, seq.median_ms / best, best_p);
  return 0;
}
