// The main job: a bias-free MLP trained on Fashion-MNIST with Muon on every
// matrix, once on N local rank processes with FSDP-sharded parameters,
// gradients and optimizer state (the distributed Muon step on Gloo, with
// the coordinator embedded in rank 0 by default), and once single-device in
// this process. Prints progress, then one summary line:
//   fashion-mnist: distributed_acc=... single_acc=... max_abs_param_diff=...
//   max_rel_loss_diff=... ranks=4 layout=... wall_s=...
//
// Data parallelism is exact: each rank computes the gradient of its quarter
// of every batch (scaled by 1/batch), and the reduce-scatter sums the
// micro-batch gradients in rank order; the single-device run accumulates
// the same micro-batches in the same order. So the two runs agree bit for
// bit whenever the distributed Muon step does.
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/status_macros.h"
#include "control/process_group.h"
#include "examples/fashion_mnist/idx.h"
#include "examples/fashion_mnist/mlp.h"
#include "server/embedded_coordinator.h"
#include "tools/launcher.h"

ABSL_FLAG(int, nproc, 4, "Number of local rank processes.");
ABSL_FLAG(int, epochs, 3, "Training epochs.");
ABSL_FLAG(int, batch_size, 1000, "Global batch size (divisible by nproc).");
ABSL_FLAG(std::string, hidden, "512,512", "Hidden layer widths.");
ABSL_FLAG(double, lr, 0.02, "Muon learning rate.");
ABSL_FLAG(double, weight_decay, 0.0, "Muon decoupled weight decay.");
ABSL_FLAG(double, momentum, 0.95, "Muon momentum.");
ABSL_FLAG(std::string, adjust_lr_fn, "original",
          "original | match_rms_adamw | spectral_norm");
ABSL_FLAG(std::string, layout, "fsdp",
          "fsdp (Shard(0)), fsdp1 (Shard(1)) or ddp (Replicate()).");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Folder with the Fashion-MNIST IDX files.");
ABSL_FLAG(int, train_limit, 0,
          "Use only the first N training images (0 = all).");
ABSL_FLAG(uint64_t, seed, 1234, "Seed of initialisation and shuffling.");
ABSL_FLAG(int, log_every, 20, "Print the loss every N steps.");
ABSL_FLAG(bool, async_gpu_parallelism, false,
          "Async mode (communication thread, prefetch) instead of the "
          "sequential debug mode.");
ABSL_FLAG(int, prefetch_count, 0, "Buckets gathered ahead in async mode.");
ABSL_FLAG(
    std::string, coordinator, "",
    "host:port of a running muon-coordinator; empty = embedded in rank 0.");
// Internal: set by the launcher on rank processes.
ABSL_FLAG(std::string, job_id, "",
          "Job id the ranks name; empty: the --coordinator daemon's job (or "
          "fashion-mnist for rank 0's embedded coordinator).");
ABSL_FLAG(int, rank, -1, "Internal: this process's rank.");
ABSL_FLAG(std::string, out_dir, "", "Internal: where ranks leave results.");
ABSL_FLAG(std::string, port_file, "", "Internal: rank 0 writes the port here.");

namespace muon::examples {
namespace {

struct RunResult {
  std::vector<float> losses;                // mean loss per step
  std::vector<std::vector<float>> weights;  // full final weights
  double accuracy = 0;
};

std::vector<int64_t> LayerSizes(int64_t in, int64_t classes) {
  std::vector<int64_t> sizes{in};
  for (absl::string_view h : absl::StrSplit(absl::GetFlag(FLAGS_hidden), ',')) {
    int64_t v = 0;
    if (absl::SimpleAtoi(h, &v) && v > 0) sizes.push_back(v);
  }
  sizes.push_back(classes);
  return sizes;
}

// The optimizer options of the flags; a bad --adjust_lr_fn is named in
// torch's words (ApplyMuonOptionNames).
absl::StatusOr<MuonOptions> OptimizerOptions() {
  MuonOptions o;
  o.lr = absl::GetFlag(FLAGS_lr);
  o.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  o.momentum = absl::GetFlag(FLAGS_momentum);
  MuonOptionNames names;
  names.adjust_lr_fn = absl::GetFlag(FLAGS_adjust_lr_fn);
  if (absl::Status s = ApplyMuonOptionNames(names, &o); !s.ok()) return s;
  return o;
}

Placement LayoutPlacement() {
  const std::string layout = absl::GetFlag(FLAGS_layout);
  if (layout == "fsdp1") return Placement::Shard(1);
  if (layout == "ddp") return Placement::Replicate();
  return Placement::Shard(0);
}

// Shuffled sample order of one epoch, identical in every process.
std::vector<int64_t> EpochOrder(int64_t n, int epoch) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed) * 7919 + epoch);
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap(order[i], order[rng() % static_cast<uint64_t>(i + 1)]);
  }
  return order;
}

void CopySamples(const Dataset& d, const std::vector<int64_t>& order,
                 int64_t begin, int64_t count, std::vector<float>* x,
                 std::vector<int32_t>* y) {
  x->resize(count * d.features);
  y->resize(count);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t s = order[begin + i];
    std::copy_n(d.images.data() + s * d.features, d.features,
                x->data() + i * d.features);
    (*y)[i] = d.labels[s];
  }
}

double TestAccuracy(Mlp& mlp, const std::vector<const float*>& w,
                    const Dataset& test) {
  int64_t correct = 0;
  const int64_t chunk = 1000;
  for (int64_t b = 0; b < test.count; b += chunk) {
    const int64_t n = std::min(chunk, test.count - b);
    correct += mlp.CountCorrect(w, test.images.data() + b * test.features,
                                test.labels.data() + b, n);
  }
  return static_cast<double>(correct) / test.count;
}

struct Data {
  Dataset train;
  Dataset test;
};

absl::StatusOr<Data> LoadData() {
  Data d;
  const std::string dir = absl::GetFlag(FLAGS_data_dir);
  MUON_ASSIGN_OR_RETURN(d.train, LoadIdxDataset(dir, "train"));
  MUON_ASSIGN_OR_RETURN(d.test, LoadIdxDataset(dir, "t10k"));
  const int limit = absl::GetFlag(FLAGS_train_limit);
  if (limit > 0 && limit < d.train.count) d.train.count = limit;
  return d;
}

// Trains with `world` micro-batches per step: one rank of the distributed
// run on `pg`, or (pg == nullptr) a single device that accumulates the
// micro-batches itself. The trainer owns its parameters' shards and
// gradients; the optimizer steps views of them in place.
class Trainer {
 public:
  Trainer(const Data& data, int world, ProcessGroup* pg)
      : data_(data),
        world_(world),
        pg_(pg),
        single_(pg == nullptr),
        rank_(single_ ? 0 : pg->rank),
        tag_(single_ ? "single" : absl::StrCat("rank ", rank_)),
        log_(single_ || rank_ == 0),
        mlp_(LayerSizes(data.train.features, 10)),
        layers_(mlp_.num_layers()),
        placement_(LayoutPlacement()) {}

  absl::StatusOr<RunResult> Run();

 private:
  absl::Status MakeParams();
  absl::Status MakeOptimizer();
  void MakeFullBuffers();
  // FSDP unshard: every rank's shard of layer l into full_w_[l].
  absl::Status Unshard(int l);
  // Sums the ranks' full gradients of layer l into this rank's shard, in
  // rank order (the reduce-scatter of FSDP; all-reduce for DDP).
  absl::Status ReduceScatter(int l);
  // Forward and backward of step s of the epoch (`order`): the gradient
  // shards in params_, every micro-batch's loss in losses_.
  absl::Status Gradients(const std::vector<int64_t>& order, int64_t s);
  absl::Status Epoch(int epoch, RunResult* result);
  void Log(const std::string& line) const;

  const Data& data_;
  const int world_;
  ProcessGroup* const pg_;
  const bool single_;
  const int rank_;
  const std::string tag_;
  const bool log_;
  Mlp mlp_;
  const int layers_;
  const Placement placement_;
  std::vector<Parameter> params_;        // this rank's shards
  std::vector<std::vector<Box>> boxes_;  // per layer, every rank's box
  std::unique_ptr<Muon> opt_;
  // Full weights (FSDP unshard), gradients and (single) their sum.
  std::vector<std::vector<float>> full_w_, full_g_, acc_g_;
  std::vector<const float*> wptr_;
  std::vector<float*> gptr_;
  std::vector<float> gathered_, send_, recv_;  // collective scratch
  std::vector<float> x_;
  std::vector<int32_t> y_;
  std::vector<float> losses_;  // per micro-batch
  double step_seconds_ = 0;    // time inside Muon::Step, summed
  absl::Time start_;
};

void Trainer::Log(const std::string& line) const {
  if (!log_) return;
  std::printf("[%s] %s\n", tag_.c_str(), line.c_str());
  std::fflush(stdout);
}

absl::Status Trainer::MakeParams() {
  const Mesh mesh =
      Mesh::OneDim(world_, placement_.is_shard() ? "dp_shard" : "dp_replicate");
  params_.resize(layers_);
  boxes_.resize(layers_);
  for (int l = 0; l < layers_; ++l) {
    const int64_t r = mlp_.rows(l), c = mlp_.cols(l);
    std::vector<float> full = InitLinear(r, c, absl::GetFlag(FLAGS_seed), l);
    Parameter& p = params_[l];
    p.name = absl::StrCat("fc", l + 1, ".weight");
    p.global_shape = {r, c};
    if (single_) {
      boxes_[l] = {Box{Range{0, r}, Range{0, c}}};
    } else {
      MUON_ASSIGN_OR_RETURN(boxes_[l], AllBoxes(r, c, {placement_}, mesh));
    }
    const Box& mine = boxes_[l][rank_];
    p.local_shape = {mine.rows.size(), mine.cols.size()};
    p.data.resize(mine.numel());
    p.grad.assign(mine.numel(), 0.0f);
    CopyRegion(full.data(), Box{Range{0, r}, Range{0, c}}, p.data.data(), mine,
               mine);
  }
  return absl::OkStatus();
}

absl::Status Trainer::MakeOptimizer() {
  // The optimizer works on views of the trainer's own buffers: it reads
  // the gradients and updates the weights in place.
  std::vector<ParamView> views;
  for (Parameter& p : params_) views.push_back(p.View());
  std::optional<DistributedConfig> config;
  if (!single_) {
    AutoConfigOptions auto_options;
    if (placement_.is_shard()) {
      auto_options.fsdp = pg_->comm.get();
      auto_options.fsdp_shard_dim = placement_.dim;
    } else {
      auto_options.ddp = pg_->comm.get();
    }
    auto_options.coordinator = pg_->coordinator.get();
    auto_options.incarnation = pg_->incarnation;
    MUON_ASSIGN_OR_RETURN(config, CreateAutoConfig(views, auto_options));
    config->execution.set_async_gpu_parallelism(
        absl::GetFlag(FLAGS_async_gpu_parallelism));
    config->execution.set_prefetch_count(absl::GetFlag(FLAGS_prefetch_count));
  }
  MUON_ASSIGN_OR_RETURN(MuonOptions options, OptimizerOptions());
  MUON_ASSIGN_OR_RETURN(opt_, Muon::Create(views, options, config));
  std::string owners;
  for (const auto& m : opt_->plan().matrices()) {
    absl::StrAppend(&owners, " ", m.param(), "->", m.owner());
  }
  Log(absl::StrFormat("plan %s: %d matrices, %d buckets, owners:%s",
                      opt_->plan().hash(), opt_->plan().matrices_size(),
                      opt_->plan().buckets_size(), owners));
  return absl::OkStatus();
}

void Trainer::MakeFullBuffers() {
  full_w_.resize(layers_);
  full_g_.resize(layers_);
  acc_g_.resize(layers_);
  for (int l = 0; l < layers_; ++l) {
    full_w_[l].resize(mlp_.rows(l) * mlp_.cols(l));
    full_g_[l].resize(full_w_[l].size());
    if (single_) acc_g_[l].resize(full_w_[l].size());
    wptr_.push_back(full_w_[l].data());
    gptr_.push_back(full_g_[l].data());
  }
  losses_.assign(world_, 0.0f);
}

absl::Status Trainer::Unshard(int l) {
  const Box full{Range{0, mlp_.rows(l)}, Range{0, mlp_.cols(l)}};
  if (single_ || boxes_[l][rank_] == full) {
    full_w_[l] = params_[l].data;
    return absl::OkStatus();
  }
  std::vector<int64_t> counts(world_);
  for (int q = 0; q < world_; ++q) counts[q] = boxes_[l][q].numel();
  gathered_.resize(std::accumulate(counts.begin(), counts.end(), int64_t{0}));
  MUON_RETURN_IF_ERROR(pg_->comm->AllGatherV(params_[l].data.data(),
                                             params_[l].data.size(),
                                             gathered_.data(), counts));
  int64_t off = 0;
  for (int q = 0; q < world_; ++q) {
    CopyRegion(gathered_.data() + off, boxes_[l][q], full_w_[l].data(), full,
               boxes_[l][q]);
    off += counts[q];
  }
  return absl::OkStatus();
}

absl::Status Trainer::ReduceScatter(int l) {
  const Box full{Range{0, mlp_.rows(l)}, Range{0, mlp_.cols(l)}};
  const Box& mine = boxes_[l][rank_];
  std::vector<int64_t> send_counts(world_), recv_counts(world_, mine.numel());
  for (int q = 0; q < world_; ++q) send_counts[q] = boxes_[l][q].numel();
  send_.resize(
      std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0}));
  recv_.resize(mine.numel() * world_);
  int64_t off = 0;
  for (int q = 0; q < world_; ++q) {
    CopyRegion(full_g_[l].data(), full, send_.data() + off, boxes_[l][q],
               boxes_[l][q]);
    off += send_counts[q];
  }
  MUON_RETURN_IF_ERROR(pg_->comm->AllToAllV(send_.data(), send_counts,
                                            recv_.data(), recv_counts));
  std::vector<float>& g = params_[l].grad;
  std::copy_n(recv_.data(), mine.numel(), g.data());
  for (int q = 1; q < world_; ++q) {
    const float* part = recv_.data() + q * mine.numel();
    for (int64_t i = 0; i < mine.numel(); ++i) g[i] += part[i];
  }
  return absl::OkStatus();
}

absl::Status Trainer::Gradients(const std::vector<int64_t>& order, int64_t s) {
  const int64_t batch = absl::GetFlag(FLAGS_batch_size);
  const int64_t micro = batch / world_;
  if (!single_) {
    CopySamples(data_.train, order, s * batch + rank_ * micro, micro, &x_, &y_);
    const float mine =
        mlp_.ForwardBackward(wptr_, x_.data(), y_.data(), micro, batch, gptr_);
    for (int l = 0; l < layers_; ++l) MUON_RETURN_IF_ERROR(ReduceScatter(l));
    return pg_->comm->AllGatherV(&mine, 1, losses_.data(),
                                 std::vector<int64_t>(world_, 1));
  }
  for (int k = 0; k < world_; ++k) {
    CopySamples(data_.train, order, s * batch + k * micro, micro, &x_, &y_);
    losses_[k] =
        mlp_.ForwardBackward(wptr_, x_.data(), y_.data(), micro, batch, gptr_);
    for (int l = 0; l < layers_; ++l) {
      if (k == 0) {
        acc_g_[l] = full_g_[l];
      } else {
        for (size_t i = 0; i < acc_g_[l].size(); ++i) {
          acc_g_[l][i] += full_g_[l][i];
        }
      }
    }
  }
  for (int l = 0; l < layers_; ++l) {
    std::copy(acc_g_[l].begin(), acc_g_[l].end(), params_[l].grad.begin());
  }
  return absl::OkStatus();
}

absl::Status Trainer::Epoch(int epoch, RunResult* result) {
  const int64_t batch = absl::GetFlag(FLAGS_batch_size);
  const int64_t steps_per_epoch = data_.train.count / batch;
  const std::vector<int64_t> order = EpochOrder(data_.train.count, epoch);
  for (int64_t s = 0; s < steps_per_epoch; ++s) {
    for (int l = 0; l < layers_; ++l) MUON_RETURN_IF_ERROR(Unshard(l));
    MUON_RETURN_IF_ERROR(Gradients(order, s));
    float total = losses_[0];
    for (int k = 1; k < world_; ++k) total += losses_[k];
    const float mean = total / static_cast<float>(batch);
    result->losses.push_back(mean);
    const absl::Time step_start = absl::Now();
    MUON_RETURN_IF_ERROR(opt_->Step());
    step_seconds_ += absl::ToDoubleSeconds(absl::Now() - step_start);
    const int64_t step = epoch * steps_per_epoch + s + 1;
    if (step % absl::GetFlag(FLAGS_log_every) == 0 || step == 1) {
      Log(absl::StrFormat("epoch %d step %lld/%lld loss %.5f  (%.1f s)",
                          epoch + 1, static_cast<long long>(s + 1),
                          static_cast<long long>(steps_per_epoch), mean,
                          absl::ToDoubleSeconds(absl::Now() - start_)));
    }
  }
  for (int l = 0; l < layers_; ++l) MUON_RETURN_IF_ERROR(Unshard(l));
  result->accuracy = TestAccuracy(mlp_, wptr_, data_.test);
  Log(absl::StrFormat("epoch %d test accuracy %.4f", epoch + 1,
                      result->accuracy));
  return absl::OkStatus();
}

absl::StatusOr<RunResult> Trainer::Run() {
  MUON_RETURN_IF_ERROR(MakeParams());
  MUON_RETURN_IF_ERROR(MakeOptimizer());
  MakeFullBuffers();
  RunResult result;
  start_ = absl::Now();
  for (int epoch = 0; epoch < absl::GetFlag(FLAGS_epochs); ++epoch) {
    MUON_RETURN_IF_ERROR(Epoch(epoch, &result));
  }
  const int64_t steps = static_cast<int64_t>(result.losses.size());
  Log(absl::StrFormat("optimizer step: %.2f ms mean over %lld steps",
                      steps > 0 ? 1e3 * step_seconds_ / steps : 0.0,
                      static_cast<long long>(steps)));
  for (int l = 0; l < layers_; ++l) result.weights.push_back(full_w_[l]);
  if (!single_) MUON_RETURN_IF_ERROR(pg_->comm->Barrier());
  return result;
}

absl::StatusOr<RunResult> Train(const Data& data, int world, ProcessGroup* pg) {
  return Trainer(data, world, pg).Run();
}

absl::Status WriteResult(const std::string& path, const RunResult& r) {
  std::ofstream out(path, std::ios::binary);
  auto put = [&](const void* p, size_t n) {
    out.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
  };
  uint64_t n = r.losses.size();
  put(&n, 8);
  put(r.losses.data(), n * 4);
  put(&r.accuracy, 8);
  n = r.weights.size();
  put(&n, 8);
  for (const auto& w : r.weights) {
    uint64_t m = w.size();
    put(&m, 8);
    put(w.data(), m * 4);
  }
  return out.good() ? absl::OkStatus()
                    : absl::InternalError(absl::StrCat("cannot write ", path));
}

absl::StatusOr<RunResult> ReadResult(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good())
    return absl::NotFoundError(absl::StrCat("no result at ", path));
  auto get = [&](void* p, size_t n) {
    in.read(static_cast<char*>(p), static_cast<std::streamsize>(n));
  };
  RunResult r;
  uint64_t n = 0;
  get(&n, 8);
  r.losses.resize(n);
  get(r.losses.data(), n * 4);
  get(&r.accuracy, 8);
  get(&n, 8);
  r.weights.resize(n);
  for (auto& w : r.weights) {
    uint64_t m = 0;
    get(&m, 8);
    w.resize(m);
    get(w.data(), m * 4);
  }
  if (!in.good()) return absl::DataLossError(absl::StrCat("truncated ", path));
  return r;
}

int RankMain() {
  const int rank = absl::GetFlag(FLAGS_rank);
  const int world = absl::GetFlag(FLAGS_nproc);
  openblas_set_num_threads(1);
  absl::StatusOr<Data> data = LoadData();
  if (!data.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank,
                 data.status().ToString().c_str());
    return 1;
  }
  ProcessGroupOptions options;
  options.rank = rank;
  options.world_size = world;
  options.coordinator_address = absl::GetFlag(FLAGS_coordinator);
  options.embed_coordinator = options.coordinator_address.empty();
  // With --coordinator the daemon's job id is used (an empty id in requests
  // means the coordinator's job); rank 0's embedded coordinator serves
  // "fashion-mnist". --job_id insists on a name.
  options.job_id = absl::GetFlag(FLAGS_job_id);
  if (options.job_id.empty() && options.embed_coordinator) {
    options.job_id = "fashion-mnist";
  }
  options.start_embedded_coordinator = StartEmbeddedCoordinator;
  options.port_file = absl::GetFlag(FLAGS_port_file);
  absl::StatusOr<std::unique_ptr<ProcessGroup>> pg = InitProcessGroup(options);
  if (!pg.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, pg.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<RunResult> result = Train(*data, world, pg->get());
  if (!result.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank,
                 result.status().ToString().c_str());
    return 1;
  }
  if (rank == 0) {
    absl::Status s =
        WriteResult(absl::GetFlag(FLAGS_out_dir) + "/distributed.bin", *result);
    if (!s.ok()) {
      std::fprintf(stderr, "rank 0: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

// The command line of rank `rank`'s process: this binary with the
// launcher's flags, and where to leave its result.
std::vector<std::string> RankArgv(const std::string& self, int rank, int world,
                                  const std::string& out_dir) {
  return {
      self,
      absl::StrCat("--rank=", rank),
      absl::StrCat("--nproc=", world),
      absl::StrCat("--epochs=", absl::GetFlag(FLAGS_epochs)),
      absl::StrCat("--batch_size=", absl::GetFlag(FLAGS_batch_size)),
      absl::StrCat("--hidden=", absl::GetFlag(FLAGS_hidden)),
      absl::StrFormat("--lr=%.17g", absl::GetFlag(FLAGS_lr)),
      absl::StrFormat("--weight_decay=%.17g",
                      absl::GetFlag(FLAGS_weight_decay)),
      absl::StrFormat("--momentum=%.17g", absl::GetFlag(FLAGS_momentum)),
      absl::StrCat("--adjust_lr_fn=", absl::GetFlag(FLAGS_adjust_lr_fn)),
      absl::StrCat("--layout=", absl::GetFlag(FLAGS_layout)),
      absl::StrCat("--data_dir=", absl::GetFlag(FLAGS_data_dir)),
      absl::StrCat("--train_limit=", absl::GetFlag(FLAGS_train_limit)),
      absl::StrCat("--seed=", absl::GetFlag(FLAGS_seed)),
      absl::StrCat("--log_every=", absl::GetFlag(FLAGS_log_every)),
      absl::StrCat(
          "--async_gpu_parallelism=",
          absl::GetFlag(FLAGS_async_gpu_parallelism) ? "true" : "false"),
      absl::StrCat("--prefetch_count=", absl::GetFlag(FLAGS_prefetch_count)),
      absl::StrCat("--job_id=", absl::GetFlag(FLAGS_job_id)),
      absl::StrCat("--out_dir=", out_dir)};
}

void PrintJob(const Data& data, int world, const std::string& layout) {
  std::printf(
      "fashion-mnist: %lld train / %lld test images, MLP %s, Muon lr=%g, "
      "%d epochs, batch %d; distributed run: %d rank processes, %s, "
      "coordinator %s\n",
      static_cast<long long>(data.train.count),
      static_cast<long long>(data.test.count),
      absl::StrCat(
          "784-",
          absl::StrReplaceAll(absl::GetFlag(FLAGS_hidden), {{",", "-"}}), "-10")
          .c_str(),
      absl::GetFlag(FLAGS_lr), absl::GetFlag(FLAGS_epochs),
      absl::GetFlag(FLAGS_batch_size), world, layout.c_str(),
      absl::GetFlag(FLAGS_coordinator).empty()
          ? "embedded in rank 0"
          : absl::GetFlag(FLAGS_coordinator).c_str());
  std::fflush(stdout);
}

// Runs the distributed job as `world` processes of this binary and reads
// rank 0's result from `dir`.
absl::StatusOr<RunResult> RunDistributed(int world, const std::string& dir,
                                         const std::string& port_file) {
  const std::string self = SelfExecutable();
  RankLaunchOptions launch;
  launch.world_size = world;
  launch.argv = [&](int rank) { return RankArgv(self, rank, world, dir); };
  launch.coordinator = absl::GetFlag(FLAGS_coordinator);
  launch.port_file = port_file;
  launch.timeout = absl::Minutes(30);
  MUON_RETURN_IF_ERROR(LaunchRanks(launch));
  return ReadResult(dir + "/distributed.bin");
}

// Prints the comparison line; returns whether the losses agree.
bool Compare(const RunResult& single, const RunResult& dist, int world,
             const std::string& layout, absl::Time start) {
  double max_diff = 0, max_rel = 0;
  for (size_t l = 0; l < single.weights.size(); ++l) {
    for (size_t i = 0; i < single.weights[l].size(); ++i) {
      max_diff = std::max<double>(
          max_diff, std::fabs(single.weights[l][i] - dist.weights[l][i]));
    }
  }
  for (size_t s = 0; s < single.losses.size(); ++s) {
    const double a = single.losses[s], b = dist.losses[s];
    max_rel =
        std::max(max_rel, std::fabs(a - b) / std::max(1e-12, std::fabs(a)));
  }
  std::printf(
      "fashion-mnist: distributed_acc=%.4f single_acc=%.4f "
      "max_abs_param_diff=%g max_rel_loss_diff=%g ranks=%d layout=%s "
      "wall_s=%.1f\n",
      dist.accuracy, single.accuracy, max_diff, max_rel, world, layout.c_str(),
      absl::ToDoubleSeconds(absl::Now() - start));
  std::fflush(stdout);
  return single.losses.size() == dist.losses.size() && max_rel <= 1e-4;
}

int LauncherMain() {
  const absl::Time start = absl::Now();
  const int world = absl::GetFlag(FLAGS_nproc);
  if (world < 1 || absl::GetFlag(FLAGS_batch_size) % world != 0) {
    std::fprintf(stderr, "--batch_size %d must be a multiple of --nproc %d\n",
                 absl::GetFlag(FLAGS_batch_size), world);
    return 2;
  }
  absl::StatusOr<Data> data = LoadData();
  if (!data.ok()) {
    std::fprintf(stderr, "%s\n", data.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::string> dir = MakeTempDir("fashion-mnist-");
  if (!dir.ok()) {
    std::fprintf(stderr, "%s\n", dir.status().ToString().c_str());
    return 1;
  }
  const std::string layout =
      absl::StrCat(absl::GetFlag(FLAGS_layout), "(",
                   LayoutPlacement().ToString(), " over ", world, " ranks)");
  PrintJob(*data, world, layout);
  // 1. Distributed run: N rank processes of this binary.
  const std::string port_file = *dir + "/coordinator.port";
  absl::StatusOr<RunResult> dist = RunDistributed(world, *dir, port_file);
  if (!dist.ok()) {
    std::fprintf(stderr, "fashion-mnist: %s\n",
                 dist.status().ToString().c_str());
    return 1;
  }
  // 2. The same job on a single device, in this process.
  openblas_set_num_threads(1);
  absl::StatusOr<RunResult> single = Train(*data, world, nullptr);
  if (!single.ok()) {
    std::fprintf(stderr, "single: %s\n", single.status().ToString().c_str());
    return 1;
  }
  // 3. Compare.
  const bool agree = Compare(*single, *dist, world, layout, start);
  std::remove((*dir + "/distributed.bin").c_str());
  std::remove(port_file.c_str());
  rmdir(dir->c_str());
  if (!agree) {
    std::fprintf(stderr, "fashion-mnist: the two runs' losses disagree\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace muon::examples

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_rank) >= 0) return muon::examples::RankMain();
  return muon::examples::LauncherMain();
}
