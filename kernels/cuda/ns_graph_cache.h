// What the CUDA Newton-Schulz path needs to replay whole calls as CUDA
// graphs (cudaStreamBeginCapture ... cudaGraphLaunch), as PyTorch's
// torch.cuda.CUDAGraph replays captured work: the key that says which
// captured call a new call may replay, the setting that turns graphs on,
// and a bounded cache of instantiated graphs. Plain C++ (no CUDA types:
// a graph is an opaque handle), used by kernels/cuda/newton_schulz_cuda.cu
// and tested on the CPU.
//
// A captured call bakes in its device pointers (U, O, the scratch), its
// shape, precision and every option: a replay is the same launches with
// the same arguments, so its results are bitwise those of the call it
// captured. The key holds all of them; the context drops every graph when
// its scratch moves or its symmetric-product setting changes.
#ifndef MUON_KERNELS_CUDA_NS_GRAPH_CACHE_H_
#define MUON_KERNELS_CUDA_NS_GRAPH_CACHE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/newton_schulz.h"
#include "kernels/ns_engine.h"

namespace muon {
namespace kernels {
namespace cuda {

// The bytes that tell captured calls of NewtonSchulzBatched apart: the
// device pointers `u` and `out`, batch, rows, cols, the precision and every
// field of `options` (raw bytes, so that coefficients equal to the last
// bit match and no others do).
inline std::string NsGraphKey(const float* u, const float* out, int64_t batch,
                              int64_t rows, int64_t cols,
                              GpuPrecision precision,
                              const NewtonSchulzOptions& options) {
  // Every field by name: a field added to NewtonSchulzOptions stops this
  // from compiling until it joins the key.
  const auto& [a, b, c, eps, steps, coefficients, norm_scale, method,
               gram_restart_every] = options;
  std::string key;
  auto put = [&key](const auto& value) {
    key.append(reinterpret_cast<const char*>(&value), sizeof(value));
  };
  put(u);
  put(out);
  put(batch);
  put(rows);
  put(cols);
  put(precision);
  put(a);
  put(b);
  put(c);
  put(eps);
  put(steps);
  put(norm_scale);
  put(method);
  put(gram_restart_every);
  const int64_t schedule = static_cast<int64_t>(coefficients.size());
  put(schedule);
  for (const std::array<double, 3>& abc : coefficients) put(abc);
  return key;
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

// Instantiated graphs (opaque handles: cudaGraphExec_t) by NsGraphKey, the
// most recently used last, at most `capacity` (>= 1). It frees nothing itself:
// Insert and Clear hand back what the caller must destroy
// (cudaGraphExecDestroy, which defers the free of a graph still running).
// Thread-compatible, as its context.
class NsGraphCache {
 public:
  explicit NsGraphCache(int capacity)
      : capacity_(capacity < 1 ? 1 : capacity) {}

  // The graph of `key`, now the most recently used, or nullptr.
  void* Find(const std::string& key) {
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].first != key) continue;
      std::pair<std::string, void*> hit = std::move(entries_[i]);
      entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
      entries_.push_back(std::move(hit));
      return entries_.back().second;
    }
    return nullptr;
  }
  // Keeps `graph` for `key` (not yet in the cache) as the most recently
  // used. Returns the least recently used graph it dropped to stay within
  // the capacity, or nullptr.
  void* Insert(std::string key, void* graph) {
    void* dropped = nullptr;
    if (static_cast<int>(entries_.size()) >= capacity_) {
      dropped = entries_.front().second;
      entries_.erase(entries_.begin());
    }
    entries_.emplace_back(std::move(key), graph);
    return dropped;
  }
  // Empties the cache; returns every graph it held.
  std::vector<void*> Clear() {
    std::vector<void*> all;
    for (auto& entry : entries_) all.push_back(entry.second);
    entries_.clear();
    return all;
  }
  int size() const { return static_cast<int>(entries_.size()); }

 private:
  const int capacity_;
  std::vector<std::pair<std::string, void*>> entries_;
};

}  // namespace cuda
}  // namespace kernels
}  // namespace muon

#endif  // MUON_KERNELS_CUDA_NS_GRAPH_CACHE_H_
