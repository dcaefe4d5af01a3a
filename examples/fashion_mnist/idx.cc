#include "examples/fashion_mnist/idx.h"

#include <zlib.h>

#include <fstream>

#include "absl/strings/str_cat.h"

namespace muon::examples {
namespace {

// Reads a whole file, inflating it when it is gzipped (gzread reads plain
// files as they are).
absl::StatusOr<std::string> ReadMaybeGzip(const std::string& base) {
  std::string path = base + ".gz";
  if (!std::ifstream(path).good()) path = base;
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "cannot open ", base,
        "[.gz]: install the Debian package "
        "dataset-fashion-mnist (apt-get install dataset-fashion-mnist) or "
        "pass --data_dir"));
  }
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, n);
  const bool error = n < 0;
  gzclose(f);
  if (error) return absl::DataLossError(absl::StrCat("cannot inflate ", path));
  return out;
}

uint32_t BigEndian32(const std::string& s, size_t off) {
  return (uint32_t(uint8_t(s[off])) << 24) |
         (uint32_t(uint8_t(s[off + 1])) << 16) |
         (uint32_t(uint8_t(s[off + 2])) << 8) | uint32_t(uint8_t(s[off + 3]));
}

}  // namespace

absl::StatusOr<Dataset> LoadIdxDataset(const std::string& dir,
                                       const std::string& prefix) {
  const std::string image_path =
      absl::StrCat(dir, "/", prefix, "-images-idx3-ubyte");
  const std::string label_path =
      absl::StrCat(dir, "/", prefix, "-labels-idx1-ubyte");
  absl::StatusOr<std::string> images = ReadMaybeGzip(image_path);
  if (!images.ok()) return images.status();
  absl::StatusOr<std::string> labels = ReadMaybeGzip(label_path);
  if (!labels.ok()) return labels.status();
  if (images->size() < 16 || BigEndian32(*images, 0) != 0x803) {
    return absl::DataLossError(
        absl::StrCat(image_path, ": not an IDX3 image file"));
  }
  if (labels->size() < 8 || BigEndian32(*labels, 0) != 0x801) {
    return absl::DataLossError(
        absl::StrCat(label_path, ": not an IDX1 label file"));
  }
  Dataset d;
  d.count = BigEndian32(*images, 4);
  d.features = int64_t{BigEndian32(*images, 8)} * BigEndian32(*images, 12);
  if (BigEndian32(*labels, 4) != d.count ||
      images->size() < 16 + size_t(d.count * d.features) ||
      labels->size() < 8 + size_t(d.count)) {
    return absl::DataLossError(
        absl::StrCat(image_path, ": truncated or disagrees with ", label_path));
  }
  d.images.resize(d.count * d.features);
  for (int64_t i = 0; i < d.count * d.features; ++i) {
    d.images[i] = static_cast<uint8_t>((*images)[16 + i]) / 255.0f;
  }
  d.labels.resize(d.count);
  for (int64_t i = 0; i < d.count; ++i) {
    d.labels[i] = static_cast<uint8_t>((*labels)[8 + i]);
  }
  return d;
}

}  // namespace muon::examples
