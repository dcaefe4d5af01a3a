// libFuzzer target: the .npy reader (tools/npy.h ReadNpy, used by `muonctl
// validate` for --init/--grads). Each input is written to a file in a
// private scratch directory and read back; a file that reads must write and
// read back identically.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fuzz/fuzz_util.h"
#include "tools/npy.h"

namespace {
const char* const kFiles[] = {"in.npy", "out.npy"};
void Cleanup() { muon_fuzz::RemoveScratch(kFiles, 2); }
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool registered = (atexit(Cleanup), true);
  (void)registered;
  const std::string in = muon_fuzz::ScratchDir() + "/in.npy";
  muon_fuzz::WriteFileOrDie(in, data, size);
  absl::StatusOr<muon::NpyArray> a = muon::ReadNpy(in);
  if (!a.ok()) return 0;
  int64_t n = 1;
  for (int64_t d : a->shape) {
    if (d < 0) __builtin_trap();  // a negative dim must be an error
    if (__builtin_mul_overflow(n, d, &n)) __builtin_trap();
  }
  if (n != static_cast<int64_t>(a->data.size())) __builtin_trap();
  const std::string out = muon_fuzz::ScratchDir() + "/out.npy";
  if (!muon::WriteNpy(out, a->shape, a->data.data()).ok()) return 0;
  absl::StatusOr<muon::NpyArray> b = muon::ReadNpy(out);
  if (!b.ok() || b->shape != a->shape || b->data.size() != a->data.size() ||
      (!a->data.empty() && std::memcmp(b->data.data(), a->data.data(),
                                       a->data.size() * sizeof(float)) != 0)) {
    __builtin_trap();
  }
  return 0;
}
