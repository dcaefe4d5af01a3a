#include "kernels/blas_tiles.h"

#include <cblas.h>

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/base/call_once.h"
#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace muon {
namespace kernels {
namespace {

// A process-wide pool running the tiles of one product at a time per
// caller. The caller works on its own tiles too, so a call finishes even
// where no worker runs (a child of fork(), or ComputeThreads() == 1).
// Workers are started on demand and never stopped (the pool is leaked, as
// a process-wide singleton must be to outlive static destructors). Nothing
// here allocates once the workers run: a batch lives on its caller's stack
// and the queue is a list threaded through the batches.
class TilePool {
 public:
  static TilePool& Get() {
    static TilePool* const pool = new TilePool();
    return *pool;
  }

  int threads() {
    absl::MutexLock lock(&mu_);
    return threads_;
  }

  void SetThreads(int threads) {
    absl::MutexLock lock(&mu_);
    threads_ = threads;
    while (workers_ < threads_ - 1) {
      const int index = workers_++;
      std::thread([this, index] { WorkerLoop(index); }).detach();
    }
    work_.SignalAll();
  }

  // Runs fn(0) .. fn(count - 1), each once, on this thread and the workers;
  // returns when all have returned.
  void Run(int count, absl::FunctionRef<void(int)> fn) {
    if (count <= 0) return;
    Batch batch(fn, count);
    bool queued = false;
    {
      absl::MutexLock lock(&mu_);
      if (count > 1 && threads_ > 1) {
        PushLocked(&batch);
        queued = true;
        work_.SignalAll();
      }
    }
    if (!queued) {
      for (int i = 0; i < count; ++i) fn(i);
      return;
    }
    absl::MutexLock lock(&mu_);
    while (batch.next < batch.count) {
      const int i = TakeLocked(&batch);
      mu_.Unlock();
      fn(i);
      mu_.Lock();
      ++batch.done;
    }
    while (batch.done < batch.count) done_.Wait(&mu_);
  }

 private:
  struct Batch {
    Batch(absl::FunctionRef<void(int)> f, int n) : fn(f), count(n) {}
    absl::FunctionRef<void(int)> fn;
    const int count;
    int next = 0;            // Next tile to hand out.
    int done = 0;            // Tiles finished.
    Batch* after = nullptr;  // The next batch in the queue.
  };

  TilePool() = default;

  void PushLocked(Batch* batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Batch** end = &head_;
    while (*end != nullptr) end = &(*end)->after;
    *end = batch;
  }

  // Hands out batch->next; unlinks the batch from the queue once its last
  // tile is handed out.
  int TakeLocked(Batch* batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int i = batch->next++;
    if (batch->next == batch->count) {
      Batch** link = &head_;
      while (*link != batch) link = &(*link)->after;
      *link = batch->after;
    }
    return i;
  }

  void WorkerLoop(int index) {
    absl::MutexLock lock(&mu_);
    for (;;) {
      while (index >= threads_ - 1 || head_ == nullptr) work_.Wait(&mu_);
      Batch* batch = head_;
      const int i = TakeLocked(batch);
      mu_.Unlock();
      batch->fn(i);
      mu_.Lock();
      if (++batch->done == batch->count) done_.SignalAll();
    }
  }

  absl::Mutex mu_;
  absl::CondVar work_;  // Signalled when a batch is queued or threads_ grows.
  absl::CondVar done_;  // Signalled when a batch's last tile finishes.
  Batch* head_ ABSL_GUARDED_BY(mu_) = nullptr;  // Batches not handed out.
  int threads_ ABSL_GUARDED_BY(mu_) = 1;
  int workers_ ABSL_GUARDED_BY(mu_) = 0;  // Started (never stopped).
};

absl::once_flag init_once;
// Serializes taking OpenBLAS's thread count (AdoptBlasThreads).
absl::Mutex adopt_mu(absl::kConstInit);

// MUONRT_NUM_THREADS, when set to an integer in [1, kMaxComputeThreads]
// (not capped at the core count, unlike OPENBLAS_NUM_THREADS); 0 when
// unset. Any other value is reported on stderr and ignored.
int ThreadsFromEnvironment() {
  const char* text = std::getenv("MUONRT_NUM_THREADS");
  if (text == nullptr || *text == '\0') return 0;
  int threads = 0;
  if (absl::SimpleAtoi(text, &threads) && threads >= 1 &&
      threads <= kMaxComputeThreads) {
    return threads;
  }
  std::fprintf(stderr,
               "muon: warning: MUONRT_NUM_THREADS=\"%s\" is not an integer in "
               "[1, %d]; ignored\n",
               text, kMaxComputeThreads);
  return 0;
}

// Takes OpenBLAS's thread count (or MUONRT_NUM_THREADS at first use) as
// ours and sets OpenBLAS to one thread, under adopt_mu so that two callers
// cannot interleave the read and the reset.
void AdoptBlasThreads(bool first) {
  absl::MutexLock lock(&adopt_mu);
  const int blas = openblas_get_num_threads();
  if (!first && blas == 1) return;  // another caller adopted it already
  const int env = first ? ThreadsFromEnvironment() : 0;
  const int threads = std::clamp(env > 0 ? env : blas, 1, kMaxComputeThreads);
  openblas_set_num_threads(1);
  TilePool::Get().SetThreads(threads);
}

// A program's later openblas_set_num_threads(n > 1) is taken the same way
// at the next product. (Calling it while products run is not supported:
// a tile already running might see n threads.)
void EnsureSingleThreadedBlas() {
  absl::call_once(init_once, [] { AdoptBlasThreads(/*first=*/true); });
  if (openblas_get_num_threads() != 1) AdoptBlasThreads(/*first=*/false);
}

int TileCount(int extent, int tile) { return (extent + tile - 1) / tile; }

}  // namespace

int ComputeThreads() {
  EnsureSingleThreadedBlas();
  return TilePool::Get().threads();
}

absl::Status SetComputeThreads(int threads) {
  if (threads < 1 || threads > kMaxComputeThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetComputeThreads: threads must be in [1, ",
                     kMaxComputeThreads, "], got ", threads));
  }
  EnsureSingleThreadedBlas();
  TilePool::Get().SetThreads(threads);
  return absl::OkStatus();
}

std::string BlasCoreName() {
  const char* core = openblas_get_corename();
  const char* config = openblas_get_config();
  return absl::StrCat(core != nullptr ? core : "unknown", " (",
                      config != nullptr ? config : "OpenBLAS", ")");
}

void TiledSgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                const float* a, int lda, const float* b, int ldb, float beta,
                float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  assert(k >= 0 && ldc >= n);
  assert(lda >= std::max(1, trans_a ? m : k));
  assert(ldb >= std::max(1, trans_b ? k : n));
  EnsureSingleThreadedBlas();
  const int row_tiles = TileCount(m, kTileRows);
  const int col_tiles = TileCount(n, kTileCols);
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  TilePool::Get().Run(row_tiles * col_tiles, [&](int tile) {
    const int i0 = (tile / col_tiles) * kTileRows;
    const int j0 = (tile % col_tiles) * kTileCols;
    const int rows = std::min(kTileRows, m - i0);
    const int cols = std::min(kTileCols, n - j0);
    // Rows i0.. of op(A); columns j0.. of op(B).
    const float* a_tile = trans_a ? a + i0 : a + static_cast<int64_t>(i0) * lda;
    const float* b_tile = trans_b ? b + static_cast<int64_t>(j0) * ldb : b + j0;
    cblas_sgemm(CblasRowMajor, ta, tb, rows, cols, k, alpha, a_tile, lda,
                b_tile, ldb, beta, c + static_cast<int64_t>(i0) * ldc + j0,
                ldc);
  });
}

void TiledSyrkUpper(bool trans, int n, int k, float alpha, const float* a,
                    int lda, float beta, float* c, int ldc) {
  if (n <= 0) return;
  assert(k >= 0 && ldc >= n && lda >= std::max(1, trans ? n : k));
  EnsureSingleThreadedBlas();
  const int tiles = TileCount(n, kTileRows);
  // Tile (ti, tj) with ti <= tj, numbered row by row over the upper
  // triangle of the tiles.
  TilePool::Get().Run(tiles * (tiles + 1) / 2, [&](int tile) {
    int ti = 0;
    while (tile >= tiles - ti) tile -= tiles - ti++;
    const int tj = ti + tile;
    const int i0 = ti * kTileRows;
    const int j0 = tj * kTileRows;
    const int rows = std::min(kTileRows, n - i0);
    const int cols = std::min(kTileRows, n - j0);
    // Rows i0.. (and j0..) of op(A).
    auto row_of = [&](int r) {
      return trans ? a + r : a + static_cast<int64_t>(r) * lda;
    };
    float* c_tile = c + static_cast<int64_t>(i0) * ldc + j0;
    if (ti == tj) {
      cblas_ssyrk(CblasRowMajor, CblasUpper, trans ? CblasTrans : CblasNoTrans,
                  rows, k, alpha, row_of(i0), lda, beta, c_tile, ldc);
    } else {
      // op(A)[i0:, :] * op(A)[j0:, :]^T.
      cblas_sgemm(CblasRowMajor, trans ? CblasTrans : CblasNoTrans,
                  trans ? CblasNoTrans : CblasTrans, rows, cols, k, alpha,
                  row_of(i0), lda, row_of(j0), lda, beta, c_tile, ldc);
    }
  });
}

}  // namespace kernels
}  // namespace muon
