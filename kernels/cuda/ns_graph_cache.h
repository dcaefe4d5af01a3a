// What the CUDA Newton-Schulz path needs to replay whole calls as CUDA
// graphs (cudaStreamBeginCapture ... cudaGraphLaunch), as PyTorch's
// torch.cuda.CUDAGraph replays captured work: the comparison that says
// which captured call a new call may replay, the setting that turns graphs on,
// and a bounded cache of instantiated graphs. Plain C++ (no CUDA types:
// a graph is an opaque handle), used by kernels/cuda/newton_schulz_cuda.cu
// and tested on the CPU.
//
// A captured call bakes in its device pointers (U, O, the scratch), its
// shape, precision and every option: a replay is the same launches with
// the same arguments, so its results are bitwise those of the call it
// captured. The comparison covers all of them; the context drops every graph
// when its scratch moves or its symmetric-product setting changes.
#ifndef MUON_KERNELS_CUDA_NS_GRAPH_CACHE_H_
#define MUON_KERNELS_CUDA_NS_GRAPH_CACHE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/newton_schulz.h"
#include "kernels/ns_engine.h"

namespace muon {
namespace kernels {
namespace cuda {

// One call of NewtonSchulzBatched: the device pointers `u` (read) and
// `out` (written), the shape, the precision and the options (not owned).
// What a call enqueues, and what a captured graph of it bakes in. Building
// one allocates nothing, so that a call looks up its graph without
// touching the heap.
struct NsCall {
  const float* u = nullptr;
  float* out = nullptr;
  int64_t batch = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  GpuPrecision precision = GpuPrecision::kFp32;
  const NewtonSchulzOptions* options = nullptr;
};

// Whether doubles `x` and `y` have the same bits (so that coefficients
// equal to the last bit match and no others do: 0.0 and -0.0 differ).
inline bool SameBits(double x, double y) {
  uint64_t a = 0, b = 0;
  std::memcpy(&a, &x, sizeof(a));
  std::memcpy(&b, &y, sizeof(b));
  return a == b;
}

// Whether options `x` and `y` have every field the same, doubles bit for
// bit.
inline bool SameGraphOptions(const NewtonSchulzOptions& x,
                             const NewtonSchulzOptions& y) {
  // Every field by name: a field added to NewtonSchulzOptions stops this
  // from compiling until it joins the comparison.
  const auto& [xa, xb, xc, xeps, xsteps, xcoefficients, xnorm_scale, xmethod,
               xgram_restart_every] = x;
  const auto& [ya, yb, yc, yeps, ysteps, ycoefficients, ynorm_scale, ymethod,
               ygram_restart_every] = y;
  if (!SameBits(xa, ya) || !SameBits(xb, yb) || !SameBits(xc, yc) ||
      !SameBits(xeps, yeps) || xsteps != ysteps ||
      !SameBits(xnorm_scale, ynorm_scale) || xmethod != ymethod ||
      xgram_restart_every != ygram_restart_every ||
      xcoefficients.size() != ycoefficients.size()) {
    return false;
  }
  for (size_t i = 0; i < xcoefficients.size(); ++i) {
    for (size_t j = 0; j < 3; ++j) {
      if (!SameBits(xcoefficients[i][j], ycoefficients[i][j])) return false;
    }
  }
  return true;
}

// Whether a graph captured for call `x` may replay call `y`: the same
// pointers, shape and precision, and the same options (SameGraphOptions).
// Both calls' options must be non-null.
inline bool SameGraphCall(const NsCall& x, const NsCall& y) {
  // Every field by name, as SameGraphOptions.
  const auto& [xu, xout, xbatch, xrows, xcols, xprecision, xoptions] = x;
  const auto& [yu, yout, ybatch, yrows, ycols, yprecision, yoptions] = y;
  return xu == yu && xout == yout && xbatch == ybatch && xrows == yrows &&
         xcols == ycols && xprecision == yprecision &&
         SameGraphOptions(*xoptions, *yoptions);
}

// Whether NsCudaContexts replay calls as CUDA graphs, from
// MUON_NS_CUDA_GRAPHS (`text`): "1" on, "0" or null or empty off (the
// default). Returns an empty string and sets *on, or the error naming the
// variable and the text (and leaves *on).
inline std::string ParseCudaGraphs(const char* text, bool* on) {
  if (text == nullptr || *text == '\0') {
    *on = false;
    return "";
  }
  const std::string value = text;
  if (value != "0" && value != "1") {
    return "MUON_NS_CUDA_GRAPHS must be 0 or 1, got '" + value + "'";
  }
  *on = value == "1";
  return "";
}

// Instantiated graphs (opaque handles: cudaGraphExec_t) by the call they
// captured, the most recently used last, at most `capacity` (>= 1). Find
// allocates nothing; Insert keeps its own copy of the call's options. It
// frees no graph itself: Insert and Clear hand back what the caller must
// destroy (cudaGraphExecDestroy, which defers the free of a graph still
// running). Thread-compatible, as its context.
class NsGraphCache {
 public:
  explicit NsGraphCache(int capacity) : capacity_(capacity < 1 ? 1 : capacity) {
    entries_.reserve(static_cast<size_t>(capacity_));
  }

  // The graph captured for a call SameGraphCall as `call`, now the most
  // recently used, or nullptr. `call.options` must be non-null.
  void* Find(const NsCall& call) {
    for (size_t i = entries_.size(); i-- > 0;) {
      NsCall captured = entries_[i].call;
      captured.options = &entries_[i].options;
      if (!SameGraphCall(captured, call)) continue;
      // To the back by moves: the options' vectors move, none is copied.
      const auto at = entries_.begin() + static_cast<std::ptrdiff_t>(i);
      std::rotate(at, at + 1, entries_.end());
      return entries_.back().graph;
    }
    return nullptr;
  }
  // Keeps `graph` for `call` (not yet in the cache; its options are
  // copied) as the most recently used. Returns the least recently used
  // graph it dropped to stay within the capacity, or nullptr.
  void* Insert(const NsCall& call, void* graph) {
    void* dropped = nullptr;
    if (static_cast<int>(entries_.size()) >= capacity_) {
      dropped = entries_.front().graph;
      entries_.erase(entries_.begin());
    }
    Entry entry{call, *call.options, graph};
    entry.call.options = nullptr;  // `options` holds them
    entries_.push_back(std::move(entry));
    return dropped;
  }
  // Empties the cache; returns every graph it held.
  std::vector<void*> Clear() {
    std::vector<void*> all;
    for (const Entry& entry : entries_) all.push_back(entry.graph);
    entries_.clear();
    return all;
  }
  int size() const { return static_cast<int>(entries_.size()); }

 private:
  struct Entry {
    NsCall call;  // call.options is null: the entry's own are `options`
    NewtonSchulzOptions options;
    void* graph = nullptr;
  };
  const int capacity_;
  std::vector<Entry> entries_;
};

}  // namespace cuda
}  // namespace kernels
}  // namespace muon

#endif  // MUON_KERNELS_CUDA_NS_GRAPH_CACHE_H_
