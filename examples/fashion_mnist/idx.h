// Reader for the IDX files of MNIST / Fashion-MNIST (gzipped or plain), as
// shipped by Debian's dataset-fashion-mnist under
// /usr/share/datasets/fashion-mnist.
#ifndef MUON_EXAMPLES_FASHION_MNIST_IDX_H_
#define MUON_EXAMPLES_FASHION_MNIST_IDX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace muon::examples {

// Images as float32 in [0, 1], [count, rows*cols] row-major; labels 0..9.
struct Dataset {
  int64_t count = 0;
  int64_t features = 0;  // rows * cols (784)
  std::vector<float> images;
  std::vector<int32_t> labels;
};

// Loads `<dir>/<prefix>-images-idx3-ubyte[.gz]` and
// `<dir>/<prefix>-labels-idx1-ubyte[.gz]` (prefix "train" or "t10k").
// Errors: NotFound naming the file and the Debian package to install;
// DataLoss for a bad magic number or a truncated file.
absl::StatusOr<Dataset> LoadIdxDataset(const std::string& dir,
                                       const std::string& prefix);

}  // namespace muon::examples

#endif  // MUON_EXAMPLES_FASHION_MNIST_IDX_H_
