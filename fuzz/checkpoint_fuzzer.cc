// libFuzzer target: the checkpoint reader (checkpoint/checkpoint.h
// CheckpointReader::Open: metadata.json and every rank file's safetensors
// header, then ReadRegion of each small tensor as a whole).
//
// Input: files separated by the line kSeparator below: metadata.json, then
// rank_0.safetensors, rank_1.safetensors, ... (at most kMaxRanks rank files;
// extra parts are ignored). They are written to a private scratch directory
// and opened there. fuzz/corpus/checkpoint/ holds checkpoints written by
// WriteCheckpointShard/WriteCheckpointMetadata in this format.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint.h"
#include "fuzz/fuzz_util.h"

namespace {

constexpr absl::string_view kSeparator = "\n--muon-fuzz-next-file--\n";
constexpr int kMaxRanks = 4;
const char* const kFiles[] = {"metadata.json", "rank_0.safetensors",
                              "rank_1.safetensors", "rank_2.safetensors",
                              "rank_3.safetensors"};
void Cleanup() { muon_fuzz::RemoveScratch(kFiles, 1 + kMaxRanks); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool registered = (atexit(Cleanup), true);
  (void)registered;
  absl::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<absl::string_view> parts;
  while (parts.size() < 1 + kMaxRanks) {
    size_t at = rest.find(kSeparator);
    if (at == absl::string_view::npos) {
      parts.push_back(rest);
      break;
    }
    parts.push_back(rest.substr(0, at));
    rest.remove_prefix(at + kSeparator.size());
  }
  const std::string& dir = muon_fuzz::ScratchDir();
  for (size_t i = 0; i < 1 + kMaxRanks; ++i) {
    const std::string path = dir + "/" + kFiles[i];
    if (i < parts.size()) {
      muon_fuzz::WriteFileOrDie(
          path, reinterpret_cast<const uint8_t*>(parts[i].data()),
          parts[i].size());
    } else {
      unlink(path.c_str());
    }
  }
  absl::StatusOr<std::unique_ptr<muon::CheckpointReader>> reader =
      muon::CheckpointReader::Open(dir);
  if (!reader.ok()) return 0;
  std::ostringstream describe;
  (*reader)->Describe(describe);
  for (const std::string& name : (*reader)->tensor_names()) {
    absl::StatusOr<std::vector<int64_t>> shape = (*reader)->GlobalShape(name);
    if (!shape.ok()) __builtin_trap();  // a listed tensor must be found
    (void)(*reader)->Placements(name);
    // Read the whole tensor when it is small (Open checked the shapes; the
    // bound here only keeps each input fast).
    int64_t n = 1;
    bool small = true;
    std::vector<muon::Range> box;
    for (int64_t d : *shape) {
      if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > (1 << 16)) {
        small = false;
        break;
      }
      box.push_back(muon::Range{0, d});
    }
    if (!small) continue;
    std::vector<float> out(static_cast<size_t>(n));
    (void)(*reader)->ReadRegion(name, *shape, box, out.data());
  }
  return 0;
}
