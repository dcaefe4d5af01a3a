#include "examples/fashion_mnist/mlp.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace muon::examples {

Mlp::Mlp(std::vector<int64_t> sizes) : sizes_(std::move(sizes)) {
  acts_.resize(sizes_.size());
  delta_.resize(sizes_.size());
}

const float* Mlp::Forward(const std::vector<const float*>& weights,
                          const float* x, int64_t count) {
  const int layers = num_layers();
  const float* in = x;
  for (int l = 0; l < layers; ++l) {
    std::vector<float>& out = acts_[l + 1];
    out.resize(count * rows(l));
    // out[count, rows] = in[count, cols] * W^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, count, rows(l),
                cols(l), 1.0f, in, cols(l), weights[l], cols(l), 0.0f,
                out.data(), rows(l));
    if (l + 1 < layers) {
      for (float& v : out) v = v > 0.0f ? v : 0.0f;
    }
    in = out.data();
  }
  return acts_[layers].data();
}

float Mlp::ForwardBackward(const std::vector<const float*>& weights,
                           const float* x, const int32_t* labels, int64_t count,
                           int64_t global_batch,
                           const std::vector<float*>& grads) {
  const int layers = num_layers();
  const float* logits = Forward(weights, x, count);
  const int64_t classes = sizes_.back();
  std::vector<float>& d = delta_[layers];
  d.resize(count * classes);
  float loss_sum = 0.0f;
  const float scale = 1.0f / static_cast<float>(global_batch);
  for (int64_t i = 0; i < count; ++i) {
    const float* z = logits + i * classes;
    const float m = *std::max_element(z, z + classes);
    float sum = 0.0f;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(z[c] - m);
    const float log_sum = std::log(sum) + m;
    loss_sum += log_sum - z[labels[i]];
    for (int64_t c = 0; c < classes; ++c) {
      const float p = std::exp(z[c] - log_sum);
      d[i * classes + c] = (p - (c == labels[i] ? 1.0f : 0.0f)) * scale;
    }
  }
  for (int l = layers - 1; l >= 0; --l) {
    const float* in = l == 0 ? x : acts_[l].data();
    // dW[rows, cols] = delta^T[rows, count] * in[count, cols]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows(l), cols(l),
                count, 1.0f, delta_[l + 1].data(), rows(l), in, cols(l), 0.0f,
                grads[l], cols(l));
    if (l == 0) break;
    // delta_l[count, cols] = delta_{l+1}[count, rows] * W[rows, cols], masked
    // by ReLU'.
    std::vector<float>& dl = delta_[l];
    dl.resize(count * cols(l));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, count, cols(l),
                rows(l), 1.0f, delta_[l + 1].data(), rows(l), weights[l],
                cols(l), 0.0f, dl.data(), cols(l));
    const std::vector<float>& a = acts_[l];
    for (size_t k = 0; k < dl.size(); ++k) {
      if (a[k] <= 0.0f) dl[k] = 0.0f;
    }
  }
  return loss_sum;
}

int64_t Mlp::CountCorrect(const std::vector<const float*>& weights,
                          const float* x, const int32_t* labels,
                          int64_t count) {
  const float* logits = Forward(weights, x, count);
  const int64_t classes = sizes_.back();
  int64_t correct = 0;
  for (int64_t i = 0; i < count; ++i) {
    const float* z = logits + i * classes;
    if (std::max_element(z, z + classes) - z == labels[i]) ++correct;
  }
  return correct;
}

std::vector<float> InitLinear(int64_t out, int64_t in, uint64_t seed,
                              int layer) {
  std::mt19937_64 rng(seed * 1000003ULL + static_cast<uint64_t>(layer));
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  std::vector<float> w(out * in);
  for (float& v : w) {
    // 53 random bits -> [0, 1): portable, unlike std::uniform_*_distribution.
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    v = static_cast<float>((2.0 * u - 1.0) * bound);
  }
  return w;
}

}  // namespace muon::examples
