// Writes the generated seeds of fuzz/corpus/ (run by fuzz/make_seeds.sh;
// the committed corpus is its output plus the spec files copied there):
//   manifest/: the Join requests of every rank of each job spec given on the
//     command line (ManifestsFromSpec), in the manifest target's format;
//   npy/: float32 .npy files written by WriteNpy;
//   checkpoint/: 1- and 2-rank checkpoints written by WriteCheckpointShard /
//     WriteCheckpointMetadata, in the checkpoint target's format.
// Usage: make_seeds CORPUS_DIR SPEC.json...
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "common/spec.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "tools/npy.h"

namespace {

void Die(const std::string& what) {
  fprintf(stderr, "make_seeds: %s\n", what.c_str());
  exit(1);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out) Die("cannot write " + path);
}

std::string Basename(const std::string& path) {
  std::string b = path.substr(path.rfind('/') + 1);
  return b.substr(0, b.rfind('.'));
}

// `message { repeated JoinRequest joins = 1; }` on the wire.
std::string EncodeJoins(const std::vector<muon::v1::JoinRequest>& joins) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    for (const auto& j : joins) {
      std::string bytes = j.SerializeAsString();
      coded.WriteTag((1 << 3) | 2);  // field 1, wire type 2 (length-delimited)
      coded.WriteVarint32(static_cast<uint32_t>(bytes.size()));
      coded.WriteString(bytes);
    }
  }
  return out;
}

void ManifestSeeds(const std::string& corpus,
                   const std::vector<std::string>& specs) {
  for (const std::string& path : specs) {
    auto spec = muon::LoadJobSpec(path);
    if (!spec.ok()) Die(std::string(spec.status().message()));
    auto manifests = muon::ManifestsFromSpec(*spec);
    if (!manifests.ok()) Die(std::string(manifests.status().message()));
    if (manifests->size() > 8) continue;  // the target uses 8 joins at most
    std::vector<muon::v1::JoinRequest> joins;
    for (const auto& m : *manifests) {
      muon::v1::JoinRequest j;
      j.set_incarnation(1000 + m.rank());
      *j.mutable_manifest() = m;
      joins.push_back(j);
    }
    WriteFile(corpus + "/manifest/" + Basename(path) + ".bin",
              EncodeJoins(joins));
  }
}

void NpySeeds(const std::string& corpus) {
  struct Case {
    const char* name;
    std::vector<int64_t> shape;
  };
  const Case cases[] = {{"matrix_2x3", {2, 3}},
                        {"vector_4", {4}},
                        {"scalar", {}},
                        {"empty_0x5", {0, 5}},
                        {"stack_2x2x3", {2, 2, 3}}};
  for (const Case& c : cases) {
    int64_t n = 1;
    for (int64_t d : c.shape) n *= d;
    std::vector<float> data(n);
    for (int64_t i = 0; i < n; ++i) data[i] = 0.5f * i - 1.0f;
    const std::string path = corpus + "/npy/" + c.name + ".npy";
    if (!muon::WriteNpy(path, c.shape, data.data()).ok()) Die(path);
  }
}

constexpr char kSeparator[] = "\n--muon-fuzz-next-file--\n";

void CheckpointSeed(const std::string& corpus, const std::string& name,
                    int world, bool sharded) {
  char templ[] = "/tmp/muon-seed-XXXXXX";
  if (mkdtemp(templ) == nullptr) Die("mkdtemp");
  const std::string dir = templ;
  muon::CheckpointMetadata meta;
  meta.world_size = world;
  meta.mesh = muon::Mesh::OneDim(world);
  meta.plan_hash = "seedhash";
  meta.step = 7;
  std::vector<float> w(6 * 4), b(3 * 5);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.25f * i;
  for (size_t i = 0; i < b.size(); ++i) b[i] = -1.0f * i;
  for (int r = 0; r < world; ++r) {
    std::vector<muon::ShardTensorView> views(2);
    views[0].name = "layer.w";
    views[0].global_shape = {6, 4};
    const int64_t rows = sharded ? 6 / world : 6;
    const int64_t begin = sharded ? r * rows : 0;
    views[0].placements = {sharded ? "Shard(0)" : "Replicate()"};
    views[0].box = {{begin, begin + rows}, {0, 4}};
    views[0].data = w.data() + begin * 4;
    views[1].name = "layer.b";
    views[1].global_shape = {3, 5};
    views[1].placements = {"Replicate()"};
    views[1].box = {{0, 3}, {0, 5}};
    views[1].data = b.data();
    auto st = muon::WriteCheckpointShard(dir, r, meta, views);
    if (!st.ok()) Die(std::string(st.message()));
    if (r == 0) {
      st = muon::WriteCheckpointMetadata(dir, meta, views);
      if (!st.ok()) Die(std::string(st.message()));
    }
  }
  std::string bytes = ReadFile(dir + "/metadata.json");
  for (int r = 0; r < world; ++r) {
    const std::string f = dir + "/rank_" + std::to_string(r) + ".safetensors";
    bytes += kSeparator + ReadFile(f);
    unlink(f.c_str());
  }
  unlink((dir + "/metadata.json").c_str());
  rmdir(dir.c_str());
  WriteFile(corpus + "/checkpoint/" + name + ".bin", bytes);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) Die("usage: make_seeds CORPUS_DIR SPEC.json...");
  const std::string corpus = argv[1];
  ManifestSeeds(corpus, std::vector<std::string>(argv + 2, argv + argc));
  NpySeeds(corpus);
  CheckpointSeed(corpus, "one_rank", 1, false);
  CheckpointSeed(corpus, "two_ranks_sharded", 2, true);
  CheckpointSeed(corpus, "two_ranks_replicated", 2, false);
  return 0;
}
