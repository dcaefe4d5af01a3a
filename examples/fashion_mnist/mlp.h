// A bias-free MLP (Linear -> ReLU -> ... -> Linear) with softmax
// cross-entropy, on OpenBLAS, for the Fashion-MNIST job. Weights follow
// torch.nn.Linear's layout: W_l is [out_features, in_features], y = x W^T.
#ifndef MUON_EXAMPLES_FASHION_MNIST_MLP_H_
#define MUON_EXAMPLES_FASHION_MNIST_MLP_H_

#include <cstdint>
#include <vector>

namespace muon::examples {

class Mlp {
 public:
  // sizes = {784, 512, 512, 10}: layer l maps sizes[l] -> sizes[l+1].
  explicit Mlp(std::vector<int64_t> sizes);

  int num_layers() const { return static_cast<int>(sizes_.size()) - 1; }
  int64_t rows(int l) const { return sizes_[l + 1]; }  // out_features
  int64_t cols(int l) const { return sizes_[l]; }      // in_features

  // Forward and backward of the mean cross-entropy over a global batch of
  // `global_batch` samples, on the `count` samples at `x` ([count, in]
  // row-major) with `labels`. `weights[l]` are full [out, in] matrices.
  // Writes dLoss/dW_l (scaled by 1/global_batch, so micro-batch gradients
  // add up to the batch gradient) into `grads[l]` (overwritten), and returns
  // the SUM of the per-sample losses of these samples (nats).
  float ForwardBackward(const std::vector<const float*>& weights,
                        const float* x, const int32_t* labels, int64_t count,
                        int64_t global_batch, const std::vector<float*>& grads);

  // Number of correctly classified samples among `count`.
  int64_t CountCorrect(const std::vector<const float*>& weights, const float* x,
                       const int32_t* labels, int64_t count);

 private:
  // Fills acts_ for `count` samples; returns the logits.
  const float* Forward(const std::vector<const float*>& weights, const float* x,
                       int64_t count);

  std::vector<int64_t> sizes_;
  std::vector<std::vector<float>> acts_;   // post-ReLU activations per layer
  std::vector<std::vector<float>> delta_;  // dLoss/d(pre-activation)
};

// Deterministic initialisation as torch.nn.Linear (uniform in
// [-1/sqrt(in), 1/sqrt(in)]), from a 64-bit seed and the layer index.
std::vector<float> InitLinear(int64_t out, int64_t in, uint64_t seed,
                              int layer);

}  // namespace muon::examples

#endif  // MUON_EXAMPLES_FASHION_MNIST_MLP_H_
