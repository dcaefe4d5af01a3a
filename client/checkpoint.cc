#include "client/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace muon {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint files are little-endian; this host is not");
static_assert(sizeof(float) == 4, "F32 is 4 bytes");

using json = nlohmann::json;

constexpr char kMetadataFile[] = "metadata.json";
constexpr char kMetadataKey[] = "__metadata__";
constexpr char kDtypeF32[] = "F32";
constexpr size_t kMaxNameLength = 1024;
constexpr int64_t kFloatBytes = 4;

// ---------------------------------------------------------------------------
// Small helpers: paths, errno, formatting, checked arithmetic.

std::string JoinPath(const std::string& dir, absl::string_view file) {
  if (!dir.empty() && dir.back() == '/') return absl::StrCat(dir, file);
  return absl::StrCat(dir, "/", file);
}

std::string RankFileName(int rank) {
  return absl::StrCat("rank_", rank, ".safetensors");
}

// `what` is a verb phrase ("opening", "writing", ...).
absl::Status ErrnoStatus(int err, absl::string_view what,
                         const std::string& path) {
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

std::string BoxString(const std::vector<Range>& box) {
  std::vector<std::string> parts;
  parts.reserve(box.size());
  for (const Range& r : box) parts.push_back(absl::StrCat(r.begin, ":", r.end));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

std::string Quoted(const std::vector<std::string>& items) {
  std::vector<std::string> parts;
  parts.reserve(items.size());
  for (const std::string& s : items)
    parts.push_back(absl::StrCat("\"", s, "\""));
  return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
}

bool MulOk(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
bool AddOk(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

// Product of `dims` (all >= 0) times `scale`, or false on int64 overflow.
bool ScaledProduct(const std::vector<int64_t>& dims, int64_t scale,
                   int64_t* out) {
  int64_t p = scale;
  for (int64_t d : dims) {
    if (!MulOk(p, d, &p)) return false;
  }
  *out = p;
  return true;
}

std::vector<int64_t> BoxSizes(const std::vector<Range>& box) {
  std::vector<int64_t> sizes;
  sizes.reserve(box.size());
  for (const Range& r : box) sizes.push_back(r.size());
  return sizes;
}

// Box sizes are bounded by a validated global shape, so this cannot
// overflow for boxes that passed the checks.
int64_t BoxNumel(const std::vector<Range>& box) {
  int64_t n = 1;
  for (const Range& r : box) n *= r.size();
  return n;
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength || name == kMetadataKey) {
    return false;
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_' || c == '.' ||
                    c == ':' || c == '/' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string NameRule() {
  return "1 to 1024 characters of [A-Za-z0-9_.:/-], not \"__metadata__\"";
}

// ---------------------------------------------------------------------------
// File I/O.

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }

  int get() const { return fd_; }
  // Closes and reports close's errno (0 when fine).
  int Close() {
    int err = 0;
    if (fd_ >= 0 && ::close(fd_) != 0) err = errno;
    fd_ = -1;
    return err;
  }

 private:
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_;
};

absl::Status WriteAll(int fd, const void* data, size_t n,
                      const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "writing", path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

// Reads up to `n` bytes at `offset`, stopping early only at end of file.
// Returns the number of bytes read.
absl::StatusOr<int64_t> PreadFull(int fd, void* buf, int64_t n, int64_t offset,
                                  const std::string& path) {
  char* p = static_cast<char*>(buf);
  int64_t done = 0;
  while (done < n) {
    const size_t want =
        static_cast<size_t>(std::min<int64_t>(n - done, 1 << 30));
    const ssize_t r = ::pread(fd, p + done, want, offset + done);
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "reading", path);
    }
    if (r == 0) break;
    done += r;
  }
  return done;
}

absl::StatusOr<Fd> OpenForRead(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(errno, "opening", path);
  return Fd(fd);
}

absl::StatusOr<int64_t> FileSize(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "stat of", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::DataLossError(absl::StrCat(path, " is not a regular file"));
  }
  return static_cast<int64_t>(st.st_size);
}

// mkdir -p.
absl::Status MakeDirs(const std::string& dir) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, "creating directory", prefix);
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return ErrnoStatus(errno, "stat of", dir);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint path ", dir, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

struct Piece {
  const void* data;
  size_t size;
};

// Writes `pieces` to DIR/FILE through a temporary file in DIR: write, fsync,
// rename, then (best effort) fsync DIR.
absl::Status AtomicWrite(const std::string& dir, absl::string_view file,
                         const std::vector<Piece>& pieces) {
  static std::atomic<uint64_t> counter{0};
  const std::string path = JoinPath(dir, file);
  const std::string tmp =
      absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  int raw;
  do {
    raw = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  } while (raw < 0 && errno == EINTR);
  if (raw < 0) return ErrnoStatus(errno, "creating", tmp);
  Fd fd(raw);
  absl::Status status;
  for (const Piece& p : pieces) {
    status = WriteAll(fd.get(), p.data, p.size, tmp);
    if (!status.ok()) break;
  }
  if (status.ok() && ::fsync(fd.get()) != 0) {
    status = ErrnoStatus(errno, "syncing", tmp);
  }
  if (const int err = fd.Close(); status.ok() && err != 0) {
    status = ErrnoStatus(err, "closing", tmp);
  }
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoStatus(errno, absl::StrCat("renaming ", tmp, " to"), path);
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  // Make the rename durable; failure here leaves a complete file behind, so
  // it is not reported.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

std::string DumpJson(const json& j, int indent = -1) {
  return j.dump(indent, ' ', /*ensure_ascii=*/false,
                json::error_handler_t::replace);
}

// ---------------------------------------------------------------------------
// Write-side validation.

absl::Status CheckMeta(const CheckpointMetadata& meta) {
  if (meta.format_version != kCheckpointFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint format_version ", meta.format_version,
        " cannot be written; this code writes ", kCheckpointFormatVersion));
  }
  if (meta.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint world_size ", meta.world_size, " < 1"));
  }
  if (meta.step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint step ", meta.step, " < 0"));
  }
  absl::Status s = meta.mesh.Validate();
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint mesh: ", s.message()));
  }
  int64_t mesh_world = 1;
  for (int size : meta.mesh.sizes) {
    if (!MulOk(mesh_world, size, &mesh_world)) mesh_world = -1;
    if (mesh_world < 0) break;
  }
  if (mesh_world != meta.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint mesh ", meta.mesh.ToString(), " has ",
                     mesh_world, " ranks but world_size is ", meta.world_size));
  }
  return absl::OkStatus();
}

// Checks name, global shape and placements of `t`; returns the placements
// in canonical spelling.
absl::StatusOr<std::vector<std::string>> CheckTensorGlobal(
    const ShardTensorView& t, const Mesh& mesh) {
  if (!ValidName(t.name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor name \"", t.name, "\" is invalid: want ", NameRule()));
  }
  if (t.global_shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", t.name, ": global_shape is empty (need >= 1 dim)"));
  }
  for (int64_t d : t.global_shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, ": global_shape ",
                       ShapeString(t.global_shape), " has a negative dim"));
    }
  }
  int64_t bytes;
  if (!ScaledProduct(t.global_shape, kFloatBytes, &bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", t.name, ": global_shape ",
                     ShapeString(t.global_shape), " overflows int64 bytes"));
  }
  if (static_cast<int>(t.placements.size()) != mesh.ndim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", t.name, ": ", t.placements.size(),
                     " placements for a mesh of ", mesh.ndim(), " dims (",
                     mesh.ToString(), ")"));
  }
  std::vector<std::string> canonical;
  canonical.reserve(t.placements.size());
  for (const std::string& text : t.placements) {
    absl::StatusOr<Placement> p = Placement::Parse(text);
    if (!p.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, ": ", p.status().message()));
    }
    if (p->kind == Placement::Kind::kPartial) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name,
                       ": Partial() shards cannot be saved; reduce first"));
    }
    if (p->is_shard() && p->dim >= static_cast<int>(t.global_shape.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, ": placement ", text,
                       " but the tensor has ", t.global_shape.size(), " dims"));
    }
    canonical.push_back(p->ToString());
  }
  return canonical;
}

absl::Status CheckBox(const ShardTensorView& t) {
  if (t.box.size() != t.global_shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", t.name, ": box ", BoxString(t.box), " has ", t.box.size(),
        " dims but global_shape ", ShapeString(t.global_shape), " has ",
        t.global_shape.size()));
  }
  for (size_t d = 0; d < t.box.size(); ++d) {
    const Range& r = t.box[d];
    if (r.begin < 0 || r.begin > r.end || r.end > t.global_shape[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, ": box ", BoxString(t.box),
                       " lies outside global_shape ",
                       ShapeString(t.global_shape), " in dim ", d));
    }
  }
  if (t.data == nullptr && BoxNumel(t.box) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", t.name, ": data is null for non-empty box ",
                     BoxString(t.box)));
  }
  return absl::OkStatus();
}

// Validates every tensor's global info and rejects duplicate names; returns
// the canonical placements per tensor.
absl::StatusOr<std::vector<std::vector<std::string>>> CheckTensors(
    const CheckpointMetadata& meta,
    const std::vector<ShardTensorView>& tensors) {
  std::vector<std::vector<std::string>> placements;
  placements.reserve(tensors.size());
  std::set<std::string> seen;
  for (const ShardTensorView& t : tensors) {
    MUON_ASSIGN_OR_RETURN(std::vector<std::string> p,
                          CheckTensorGlobal(t, meta.mesh));
    if (!seen.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, " appears twice"));
    }
    placements.push_back(std::move(p));
  }
  return placements;
}

// ---------------------------------------------------------------------------
// Read-side JSON helpers (never throw: types are checked before get<>).

bool AsInt64(const json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return false;
    }
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (j.is_number_integer()) {
    *out = j.get<int64_t>();
    return true;
  }
  return false;
}

bool AsInt64Array(const json& j, std::vector<int64_t>* out) {
  if (!j.is_array()) return false;
  out->clear();
  out->reserve(j.size());
  for (const json& e : j) {
    int64_t v;
    if (!AsInt64(e, &v)) return false;
    out->push_back(v);
  }
  return true;
}

bool AsStringArray(const json& j, std::vector<std::string>* out) {
  if (!j.is_array()) return false;
  out->clear();
  out->reserve(j.size());
  for (const json& e : j) {
    if (!e.is_string()) return false;
    out->push_back(e.get<std::string>());
  }
  return true;
}

const json* Member(const json& obj, absl::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(std::string(key));
  return it == obj.end() ? nullptr : &*it;
}

// Shape: >= 1 dims, each >= 0, numel * 4 within int64.
bool ValidShape(const std::vector<int64_t>& shape) {
  if (shape.empty()) return false;
  for (int64_t d : shape) {
    if (d < 0) return false;
  }
  int64_t bytes;
  return ScaledProduct(shape, kFloatBytes, &bytes);
}

absl::Status CheckFormatVersion(const std::string& path, int64_t version) {
  if (version != kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": checkpoint format_version ", version,
                     " is not supported (this reader knows version ",
                     kCheckpointFormatVersion, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckFormatName(const std::string& path, const json* format) {
  if (format == nullptr || !format->is_string() ||
      format->get<std::string>() != kCheckpointFormat) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not a ", kCheckpointFormat, " file (\"format\" is ",
        format == nullptr ? "missing" : DumpJson(*format), ")"));
  }
  return absl::OkStatus();
}

// Parses metadata.json.
absl::Status ParseMetadataJson(
    const std::string& path, const std::string& text, CheckpointMetadata* meta,
    std::map<std::string, CheckpointReader::TensorInfo>* tensors) {
  const json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": not a valid JSON object"));
  }
  MUON_RETURN_IF_ERROR(CheckFormatName(path, Member(root, "format")));
  auto bad = [&path](absl::string_view field, absl::string_view want) {
    return absl::DataLossError(
        absl::StrCat(path, ": field \"", field, "\" missing or not ", want));
  };
  int64_t v;
  const json* f = Member(root, "format_version");
  if (f == nullptr || !AsInt64(*f, &v))
    return bad("format_version", "an integer");
  MUON_RETURN_IF_ERROR(CheckFormatVersion(path, v));
  meta->format_version = static_cast<int>(v);

  f = Member(root, "world_size");
  if (f == nullptr || !AsInt64(*f, &v) || v < 1 ||
      v > std::numeric_limits<int>::max()) {
    return bad("world_size", "an integer in [1, 2^31)");
  }
  meta->world_size = static_cast<int>(v);

  const json* mesh = Member(root, "mesh");
  std::vector<int64_t> sizes;
  if (mesh == nullptr || !mesh->is_object() ||
      Member(*mesh, "names") == nullptr ||
      !AsStringArray(*Member(*mesh, "names"), &meta->mesh.names) ||
      Member(*mesh, "sizes") == nullptr ||
      !AsInt64Array(*Member(*mesh, "sizes"), &sizes)) {
    return bad("mesh", "{\"names\": [string], \"sizes\": [int]}");
  }
  meta->mesh.sizes.clear();
  int64_t mesh_world = 1;
  for (int64_t s : sizes) {
    if (s < 1 || s > std::numeric_limits<int>::max() ||
        !MulOk(mesh_world, s, &mesh_world) ||
        mesh_world > std::numeric_limits<int>::max()) {
      return absl::DataLossError(absl::StrCat(
          path, ": mesh sizes ", ShapeString(sizes), " out of range"));
    }
    meta->mesh.sizes.push_back(static_cast<int>(s));
  }
  if (absl::Status s = meta->mesh.Validate(); !s.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": mesh: ", s.message()));
  }
  if (mesh_world != meta->world_size) {
    return absl::DataLossError(absl::StrCat(
        path, ": mesh ", meta->mesh.ToString(), " has ", mesh_world,
        " ranks but world_size is ", meta->world_size));
  }

  f = Member(root, "plan_hash");
  if (f == nullptr || !f->is_string()) return bad("plan_hash", "a string");
  meta->plan_hash = f->get<std::string>();

  f = Member(root, "step");
  if (f == nullptr || !AsInt64(*f, &v) || v < 0) {
    return bad("step", "an integer >= 0");
  }
  meta->step = v;

  const json* list = Member(root, "tensors");
  if (list == nullptr || !list->is_object()) return bad("tensors", "an object");
  for (auto it = list->begin(); it != list->end(); ++it) {
    const std::string& name = it.key();
    if (!ValidName(name)) {
      return absl::DataLossError(absl::StrCat(
          path, ": tensor name \"", name, "\" is invalid: want ", NameRule()));
    }
    CheckpointReader::TensorInfo info;
    const json* gs = Member(it.value(), "global_shape");
    const json* pl = Member(it.value(), "placements");
    if (gs == nullptr || !AsInt64Array(*gs, &info.global_shape) ||
        !ValidShape(info.global_shape)) {
      return absl::DataLossError(absl::StrCat(
          path, ": tensor ", name,
          ": global_shape missing, not a list of dims >= 0, or overflowing "
          "int64 bytes"));
    }
    if (pl == nullptr || !AsStringArray(*pl, &info.placements)) {
      return absl::DataLossError(absl::StrCat(
          path, ": tensor ", name, ": placements missing or not strings"));
    }
    (*tensors)[name] = std::move(info);
  }
  return absl::OkStatus();
}

// Reads the header of one rank file and adds its pieces to `tensors`.
absl::Status ReadRankHeader(
    const std::string& path, int rank, const CheckpointMetadata& meta,
    std::map<std::string, CheckpointReader::TensorInfo>* tensors,
    int64_t* file_size) {
  absl::StatusOr<Fd> fd = OpenForRead(path);
  if (!fd.ok()) {
    if (absl::IsNotFound(fd.status())) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint rank file missing: ", fd.status().message(),
          " (metadata.json says world_size ", meta.world_size, ")"));
    }
    return fd.status();
  }
  MUON_ASSIGN_OR_RETURN(const int64_t size, FileSize(fd->get(), path));
  *file_size = size;
  if (size < 8) {
    return absl::DataLossError(absl::StrCat(
        path, ": file is ", size,
        " bytes, shorter than the 8-byte safetensors header length"));
  }
  unsigned char len_bytes[8];
  MUON_ASSIGN_OR_RETURN(int64_t got,
                        PreadFull(fd->get(), len_bytes, 8, 0, path));
  if (got != 8) {
    return absl::DataLossError(
        absl::StrCat(path, ": short read of the header length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > static_cast<uint64_t>(size - 8)) {
    return absl::DataLossError(absl::StrCat(
        path, ": header length ", header_len, " exceeds file size - 8 = ",
        size - 8, " (truncated or not a safetensors file)"));
  }
  if (header_len > static_cast<uint64_t>(kCheckpointMaxHeaderBytes)) {
    return absl::DataLossError(absl::StrCat(
        path, ": header length ", header_len, " exceeds the cap of ",
        kCheckpointMaxHeaderBytes, " bytes"));
  }
  const int64_t n = static_cast<int64_t>(header_len);
  std::string text(static_cast<size_t>(n), '\0');
  MUON_ASSIGN_OR_RETURN(got, PreadFull(fd->get(), text.data(), n, 8, path));
  if (got != n) {
    return absl::DataLossError(absl::StrCat(
        path, ": header read came up short: ", got, " of ", n, " bytes"));
  }
  const int64_t data_start = 8 + n;
  const int64_t data_size = size - data_start;

  const json header = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::DataLossError(
        absl::StrCat(path, ": safetensors header is not a valid JSON object"));
  }
  const json* md = Member(header, kMetadataKey);
  if (md == nullptr || !md->is_object()) {
    return absl::DataLossError(
        absl::StrCat(path, ": no \"__metadata__\" object in the header"));
  }
  for (auto it = md->begin(); it != md->end(); ++it) {
    if (!it.value().is_string()) {
      return absl::DataLossError(absl::StrCat(
          path, ": __metadata__ value of \"", it.key(), "\" is not a string"));
    }
  }
  // All __metadata__ values are strings from here on.
  auto md_string = [md](const std::string& key, std::string* out) {
    const json* v = Member(*md, key);
    if (v == nullptr) return false;
    *out = v->get<std::string>();
    return true;
  };
  MUON_RETURN_IF_ERROR(CheckFormatName(path, Member(*md, "format")));
  std::string s;
  int64_t v;
  if (!md_string("format_version", &s) || !absl::SimpleAtoi(s, &v)) {
    return absl::DataLossError(absl::StrCat(
        path, ": __metadata__ format_version missing or not an integer"));
  }
  MUON_RETURN_IF_ERROR(CheckFormatVersion(path, v));
  auto expect_int = [&](const char* key, int64_t want) -> absl::Status {
    std::string text_value;
    int64_t value;
    if (!md_string(key, &text_value) || !absl::SimpleAtoi(text_value, &value)) {
      return absl::DataLossError(absl::StrCat(path, ": __metadata__ ", key,
                                              " missing or not an integer"));
    }
    if (value != want) {
      return absl::DataLossError(absl::StrCat(
          path, ": __metadata__ ", key, " is ", value, ", expected ", want,
          " (file from another checkpoint?)"));
    }
    return absl::OkStatus();
  };
  MUON_RETURN_IF_ERROR(expect_int("rank", rank));
  MUON_RETURN_IF_ERROR(expect_int("world_size", meta.world_size));
  MUON_RETURN_IF_ERROR(expect_int("step", meta.step));
  if (!md_string("plan_hash", &s)) {
    return absl::DataLossError(
        absl::StrCat(path, ": __metadata__ plan_hash missing"));
  }
  if (s != meta.plan_hash) {
    return absl::DataLossError(
        absl::StrCat(path, ": __metadata__ plan_hash \"", s,
                     "\" differs from metadata.json's \"", meta.plan_hash,
                     "\" (file from another checkpoint?)"));
  }

  std::vector<std::pair<int64_t, int64_t>> spans;  // data_offsets
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == kMetadataKey) continue;
    auto err = [&](absl::string_view what) {
      return absl::DataLossError(
          absl::StrCat(path, ": tensor ", name, ": ", what));
    };
    if (!ValidName(name)) {
      return err(absl::StrCat("invalid name: want ", NameRule()));
    }
    // A tensor metadata.json does not list (a parameter of a pipeline stage
    // rank 0 does not hold) takes its global shape and placements from the
    // first rank file naming it; later files must agree.
    auto info_it = tensors->find(name);
    const bool adopt = info_it == tensors->end();
    if (adopt)
      info_it = tensors->emplace(name, CheckpointReader::TensorInfo{}).first;
    CheckpointReader::TensorInfo& info = info_it->second;
    const json& entry = it.value();
    if (!entry.is_object()) return err("header entry is not an object");
    const json* dtype = Member(entry, "dtype");
    if (dtype == nullptr || !dtype->is_string()) {
      return err("dtype missing or not a string");
    }
    if (dtype->get<std::string>() != kDtypeF32) {
      return absl::UnimplementedError(absl::StrCat(
          path, ": tensor ", name, ": dtype ", dtype->get<std::string>(),
          " is not supported (only F32)"));
    }
    std::vector<int64_t> shape, offsets_json;
    const json* shape_j = Member(entry, "shape");
    if (shape_j == nullptr || !AsInt64Array(*shape_j, &shape) ||
        !ValidShape(shape)) {
      return err(
          "shape missing, not a list of dims >= 0, or overflowing "
          "int64 bytes");
    }
    int64_t bytes = 0;
    ScaledProduct(shape, kFloatBytes, &bytes);  // ValidShape checked it.
    const json* offs_j = Member(entry, "data_offsets");
    if (offs_j == nullptr || !AsInt64Array(*offs_j, &offsets_json) ||
        offsets_json.size() != 2 || offsets_json[0] < 0 ||
        offsets_json[1] < offsets_json[0]) {
      return err(
          "data_offsets missing or not [begin, end] with "
          "0 <= begin <= end");
    }
    const int64_t begin = offsets_json[0], end = offsets_json[1];
    if (end > data_size) {
      return err(absl::StrCat("data_offsets [", begin, ", ", end,
                              "] extend past the data section of ", data_size,
                              " bytes (file truncated?)"));
    }
    if (end - begin != bytes) {
      return err(absl::StrCat("data_offsets [", begin, ", ", end, "] hold ",
                              end - begin, " bytes but shape ",
                              ShapeString(shape), " needs ", bytes));
    }
    // Global placement from __metadata__.
    std::string gs_text, off_text, pl_text;
    if (!md_string(name + ".global_shape", &gs_text) ||
        !md_string(name + ".offsets", &off_text) ||
        !md_string(name + ".placements", &pl_text)) {
      return err(
          "__metadata__ lacks its .global_shape, .offsets or "
          ".placements");
    }
    const json gs_j = json::parse(gs_text, nullptr, false);
    const json off_j = json::parse(off_text, nullptr, false);
    const json pl_j = json::parse(pl_text, nullptr, false);
    std::vector<int64_t> global_shape, offsets;
    std::vector<std::string> placements;
    if (gs_j.is_discarded() || !AsInt64Array(gs_j, &global_shape)) {
      return err(absl::StrCat("global_shape \"", gs_text,
                              "\" is not a list of integers"));
    }
    if (adopt) info.global_shape = global_shape;
    if (global_shape != info.global_shape) {
      return err(absl::StrCat("global_shape ", ShapeString(global_shape),
                              " differs from metadata.json's ",
                              ShapeString(info.global_shape)));
    }
    if (pl_j.is_discarded() || !AsStringArray(pl_j, &placements)) {
      return err(absl::StrCat("placements \"", pl_text,
                              "\" is not a list of strings"));
    }
    if (adopt) info.placements = placements;
    if (placements != info.placements) {
      return err(absl::StrCat("placements ", Quoted(placements),
                              " differ from metadata.json's ",
                              Quoted(info.placements)));
    }
    if (off_j.is_discarded() || !AsInt64Array(off_j, &offsets) ||
        offsets.size() != shape.size() || shape.size() != global_shape.size()) {
      return err(absl::StrCat(
          "offsets \"", off_text, "\" and shape ", ShapeString(shape),
          " do not match the global_shape's ", global_shape.size(), " dims"));
    }
    CheckpointReader::SavedShard shard;
    shard.rank = rank;
    for (size_t d = 0; d < shape.size(); ++d) {
      int64_t stop;
      if (offsets[d] < 0 || !AddOk(offsets[d], shape[d], &stop) ||
          stop > global_shape[d]) {
        return err(absl::StrCat("box at offsets ", ShapeString(offsets),
                                " of shape ", ShapeString(shape),
                                " lies outside global_shape ",
                                ShapeString(global_shape)));
      }
      shard.box.push_back({offsets[d], stop});
    }
    shard.file_offset = data_start + begin;
    shard.bytes = bytes;
    info.shards.push_back(std::move(shard));
    spans.emplace_back(begin, end);
  }
  // safetensors: the data section is exactly the tensors, back to back.
  std::sort(spans.begin(), spans.end());
  int64_t at = 0;
  for (const auto& [begin, end] : spans) {
    if (begin != at) {
      return absl::DataLossError(
          absl::StrCat(path, ": data_offsets leave a gap or overlap at byte ",
                       at, " of the data section"));
    }
    at = end;
  }
  if (at != data_size) {
    return absl::DataLossError(absl::StrCat(path, ": tensors cover ", at,
                                            " bytes but the data section has ",
                                            data_size));
  }
  return absl::OkStatus();
}

// Reads the part `part` of `shard` (rank file `fd`) into `out`, which is laid
// out as the row-major region `region`. `part` lies inside both. One pread
// per contiguous run: the innermost dims that `part` covers whole in both
// the shard and the region are merged into the run.
absl::Status ReadPart(int fd, const std::string& path, const std::string& name,
                      const CheckpointReader::SavedShard& shard,
                      const std::vector<Range>& part,
                      const std::vector<Range>& region, float* out) {
  const int n = static_cast<int>(part.size());
  const std::vector<Range>& src = shard.box;
  std::vector<int64_t> src_stride(n, 1), dst_stride(n, 1);
  for (int d = n - 2; d >= 0; --d) {
    src_stride[d] = src_stride[d + 1] * src[d + 1].size();
    dst_stride[d] = dst_stride[d + 1] * region[d + 1].size();
  }
  int k = n - 1;
  while (k > 0 && part[k] == src[k] && part[k] == region[k]) --k;
  const int64_t run = part[k].size() * src_stride[k];  // floats
  std::vector<int64_t> idx(k);
  for (int d = 0; d < k; ++d) idx[d] = part[d].begin;
  while (true) {
    int64_t s = (part[k].begin - src[k].begin) * src_stride[k];
    int64_t t = (part[k].begin - region[k].begin) * dst_stride[k];
    for (int d = 0; d < k; ++d) {
      s += (idx[d] - src[d].begin) * src_stride[d];
      t += (idx[d] - region[d].begin) * dst_stride[d];
    }
    const int64_t offset = shard.file_offset + s * kFloatBytes;
    const int64_t want = run * kFloatBytes;
    MUON_ASSIGN_OR_RETURN(const int64_t got,
                          PreadFull(fd, out + t, want, offset, path));
    if (got != want) {
      return absl::DataLossError(absl::StrCat(
          path, ": tensor ", name, ": read of ", want, " bytes at offset ",
          offset, " came up short: got ", got));
    }
    int d = k - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < part[d].end) break;
      idx[d] = part[d].begin;
    }
    if (d < 0) break;
  }
  return absl::OkStatus();
}

// a ∩ b, or false when empty.
bool Intersect(const std::vector<Range>& a, const std::vector<Range>& b,
               std::vector<Range>* out) {
  out->resize(a.size());
  for (size_t d = 0; d < a.size(); ++d) {
    (*out)[d].begin = std::max(a[d].begin, b[d].begin);
    (*out)[d].end = std::min(a[d].end, b[d].end);
    if ((*out)[d].begin >= (*out)[d].end) return false;
  }
  return true;
}

// Appends u \ i (i inside u) as at most 2 * ndim disjoint boxes.
void Subtract(const std::vector<Range>& u, const std::vector<Range>& i,
              std::vector<std::vector<Range>>* out) {
  std::vector<Range> rest = u;
  for (size_t d = 0; d < u.size(); ++d) {
    if (rest[d].begin < i[d].begin) {
      std::vector<Range> piece = rest;
      piece[d] = {rest[d].begin, i[d].begin};
      out->push_back(std::move(piece));
    }
    if (i[d].end < rest[d].end) {
      std::vector<Range> piece = rest;
      piece[d] = {i[d].end, rest[d].end};
      out->push_back(std::move(piece));
    }
    rest[d] = i[d];
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Writing.

absl::Status WriteCheckpointShard(const std::string& dir, int rank,
                                  const CheckpointMetadata& meta,
                                  const std::vector<ShardTensorView>& tensors) {
  if (dir.empty()) {
    return absl::InvalidArgumentError("checkpoint dir is empty");
  }
  MUON_RETURN_IF_ERROR(CheckMeta(meta));
  if (rank < 0 || rank >= meta.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " outside [0, ", meta.world_size, ")"));
  }
  MUON_ASSIGN_OR_RETURN(std::vector<std::vector<std::string>> placements,
                        CheckTensors(meta, tensors));
  for (const ShardTensorView& t : tensors) MUON_RETURN_IF_ERROR(CheckBox(t));

  json md = json::object();
  md["format"] = kCheckpointFormat;
  md["format_version"] = absl::StrCat(meta.format_version);
  md["rank"] = absl::StrCat(rank);
  md["world_size"] = absl::StrCat(meta.world_size);
  md["step"] = absl::StrCat(meta.step);
  md["plan_hash"] = meta.plan_hash;
  json header = json::object();
  std::vector<Piece> pieces;
  pieces.reserve(tensors.size() + 2);
  pieces.push_back({nullptr, 8});  // header length, filled below
  pieces.push_back({nullptr, 0});  // header, filled below
  int64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ShardTensorView& t = tensors[i];
    const std::vector<int64_t> shape = BoxSizes(t.box);
    std::vector<int64_t> offsets;
    for (const Range& r : t.box) offsets.push_back(r.begin);
    const int64_t bytes = BoxNumel(t.box) * kFloatBytes;
    json entry = json::object();
    entry["dtype"] = kDtypeF32;
    entry["shape"] = shape;
    entry["data_offsets"] = json::array({offset, offset + bytes});
    header[t.name] = std::move(entry);
    md[t.name + ".global_shape"] = DumpJson(json(t.global_shape));
    md[t.name + ".offsets"] = DumpJson(json(offsets));
    md[t.name + ".placements"] = DumpJson(json(placements[i]));
    if (bytes > 0) pieces.push_back({t.data, static_cast<size_t>(bytes)});
    if (!AddOk(offset, bytes, &offset)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, ": shard data overflows int64 bytes at tensor ",
          t.name));
    }
  }
  header[kMetadataKey] = std::move(md);
  std::string text = DumpJson(header);
  // Pad so the data section starts 8-byte aligned (as safetensors does).
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  if (static_cast<int64_t>(text.size()) > kCheckpointMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": safetensors header of ", text.size(),
                     " bytes exceeds the cap of ", kCheckpointMaxHeaderBytes,
                     " (too many tensors)"));
  }
  unsigned char len_bytes[8];
  uint64_t len = text.size();
  for (int b = 0; b < 8; ++b) len_bytes[b] = (len >> (8 * b)) & 0xff;
  pieces[0] = {len_bytes, 8};
  pieces[1] = {text.data(), text.size()};

  MUON_RETURN_IF_ERROR(MakeDirs(dir));
  return AtomicWrite(dir, RankFileName(rank), pieces);
}

absl::Status WriteCheckpointMetadata(
    const std::string& dir, const CheckpointMetadata& meta,
    const std::vector<ShardTensorView>& tensors) {
  if (dir.empty()) {
    return absl::InvalidArgumentError("checkpoint dir is empty");
  }
  MUON_RETURN_IF_ERROR(CheckMeta(meta));
  MUON_ASSIGN_OR_RETURN(std::vector<std::vector<std::string>> placements,
                        CheckTensors(meta, tensors));
  json list = json::object();
  for (size_t i = 0; i < tensors.size(); ++i) {
    json entry = json::object();
    entry["global_shape"] = tensors[i].global_shape;
    entry["placements"] = placements[i];
    list[tensors[i].name] = std::move(entry);
  }
  json mesh = json::object();
  mesh["names"] = meta.mesh.names;
  mesh["sizes"] = meta.mesh.sizes;
  json root = json::object();
  root["format"] = kCheckpointFormat;
  root["format_version"] = meta.format_version;
  root["world_size"] = meta.world_size;
  root["mesh"] = std::move(mesh);
  root["plan_hash"] = meta.plan_hash;
  root["step"] = meta.step;
  root["tensors"] = std::move(list);
  std::string text = DumpJson(root, /*indent=*/2);
  text.push_back('\n');
  if (static_cast<int64_t>(text.size()) > kCheckpointMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metadata.json of ", text.size(), " bytes exceeds the cap of ",
        kCheckpointMaxHeaderBytes, " (too many tensors)"));
  }
  MUON_RETURN_IF_ERROR(MakeDirs(dir));
  return AtomicWrite(dir, kMetadataFile, {{text.data(), text.size()}});
}

// ---------------------------------------------------------------------------
// Reading.

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& dir) {
  std::unique_ptr<CheckpointReader> reader(new CheckpointReader());
  reader->dir_ = dir;
  const std::string meta_path = JoinPath(dir, kMetadataFile);
  {
    absl::StatusOr<Fd> fd = OpenForRead(meta_path);
    if (!fd.ok()) {
      if (absl::IsNotFound(fd.status())) {
        return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir, ": ",
                                                fd.status().message()));
      }
      return fd.status();
    }
    MUON_ASSIGN_OR_RETURN(const int64_t size, FileSize(fd->get(), meta_path));
    if (size > kCheckpointMaxHeaderBytes) {
      return absl::DataLossError(absl::StrCat(meta_path, ": ", size,
                                              " bytes exceeds the cap of ",
                                              kCheckpointMaxHeaderBytes));
    }
    std::string text(static_cast<size_t>(size), '\0');
    MUON_ASSIGN_OR_RETURN(const int64_t got, PreadFull(fd->get(), text.data(),
                                                       size, 0, meta_path));
    text.resize(static_cast<size_t>(got));
    MUON_RETURN_IF_ERROR(ParseMetadataJson(meta_path, text, &reader->metadata_,
                                           &reader->tensors_));
  }
  reader->file_sizes_.assign(reader->metadata_.world_size, 0);
  for (int r = 0; r < reader->metadata_.world_size; ++r) {
    MUON_RETURN_IF_ERROR(ReadRankHeader(JoinPath(dir, RankFileName(r)), r,
                                        reader->metadata_, &reader->tensors_,
                                        &reader->file_sizes_[r]));
  }
  return reader;
}

std::vector<std::string> CheckpointReader::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) names.push_back(name);
  return names;
}

const CheckpointReader::TensorInfo* CheckpointReader::FindTensor(
    const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::vector<int64_t>> CheckpointReader::GlobalShape(
    const std::string& name) const {
  const TensorInfo* info = FindTensor(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", dir_, " has no tensor \"", name, "\""));
  }
  return info->global_shape;
}

absl::StatusOr<std::vector<std::string>> CheckpointReader::Placements(
    const std::string& name) const {
  const TensorInfo* info = FindTensor(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", dir_, " has no tensor \"", name, "\""));
  }
  return info->placements;
}

absl::Status CheckpointReader::ReadRegion(
    const std::string& name, const std::vector<int64_t>& expected_global_shape,
    const std::vector<Range>& box, float* out) const {
  const TensorInfo* info = FindTensor(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", dir_, " has no tensor \"", name, "\""));
  }
  const std::string where =
      absl::StrCat("checkpoint ", dir_, ": tensor ", name);
  if (expected_global_shape != info->global_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": expected global shape ", ShapeString(expected_global_shape),
        " but the checkpoint has ", ShapeString(info->global_shape)));
  }
  if (box.size() != info->global_shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": box ", BoxString(box), " has ", box.size(),
        " dims but the global shape ", ShapeString(info->global_shape), " has ",
        info->global_shape.size()));
  }
  for (size_t d = 0; d < box.size(); ++d) {
    if (box[d].begin < 0 || box[d].begin > box[d].end ||
        box[d].end > info->global_shape[d]) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": box ", BoxString(box), " lies outside global shape ",
          ShapeString(info->global_shape), " in dim ", d));
    }
  }
  if (BoxNumel(box) == 0) return absl::OkStatus();
  if (out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": out is null for box ", BoxString(box)));
  }
  std::vector<std::vector<Range>> uncovered = {box};
  std::vector<std::vector<Range>> next;
  std::vector<Range> part;
  for (const SavedShard& shard : info->shards) {
    if (uncovered.empty()) break;
    if (shard.bytes == 0) continue;
    const std::string path = JoinPath(dir_, RankFileName(shard.rank));
    Fd fd;
    next.clear();
    for (const std::vector<Range>& u : uncovered) {
      if (!Intersect(u, shard.box, &part)) {
        next.push_back(u);
        continue;
      }
      if (fd.get() < 0) {
        MUON_ASSIGN_OR_RETURN(fd, OpenForRead(path));
        MUON_ASSIGN_OR_RETURN(const int64_t size, FileSize(fd.get(), path));
        if (size != file_sizes_[shard.rank]) {
          return absl::DataLossError(absl::StrCat(
              path, ": tensor ", name, ": file is ", size, " bytes but was ",
              file_sizes_[shard.rank], " when the checkpoint was opened"));
        }
      }
      MUON_RETURN_IF_ERROR(
          ReadPart(fd.get(), path, name, shard, part, box, out));
      Subtract(u, part, &next);
    }
    uncovered.swap(next);
  }
  if (!uncovered.empty()) {
    std::vector<std::string> saved;
    for (const SavedShard& shard : info->shards) {
      if (saved.size() == 8) {
        saved.push_back("...");
        break;
      }
      saved.push_back(
          absl::StrCat("rank ", shard.rank, " ", BoxString(shard.box)));
    }
    return absl::DataLossError(absl::StrCat(
        where, ": region ", BoxString(box),
        " is not covered by the saved shards: ", BoxString(uncovered.front()),
        " is in no rank file (saved: ",
        saved.empty() ? "none" : absl::StrJoin(saved, ", "), ")"));
  }
  return absl::OkStatus();
}

void CheckpointReader::Describe(std::ostream& out) const {
  out << "checkpoint " << dir_ << "\n";
  out << "  format " << kCheckpointFormat << " version "
      << metadata_.format_version << "\n";
  out << "  step " << metadata_.step << "\n";
  out << "  world size " << metadata_.world_size << ", mesh "
      << metadata_.mesh.ToString() << "\n";
  out << "  plan hash "
      << (metadata_.plan_hash.empty() ? "(none)" : metadata_.plan_hash) << "\n";
  out << "  " << tensors_.size() << " tensor"
      << (tensors_.size() == 1 ? "" : "s") << "\n";
  for (const auto& [name, info] : tensors_) {
    int64_t bytes = 0;
    ScaledProduct(info.global_shape, kFloatBytes, &bytes);
    out << "  " << name << ": F32 " << ShapeString(info.global_shape) << " ("
        << bytes << " bytes), placements " << Quoted(info.placements) << "\n";
    for (const SavedShard& shard : info.shards) {
      out << "    rank " << shard.rank << ": box " << BoxString(shard.box)
          << ", " << shard.bytes << " bytes\n";
    }
  }
}

}  // namespace muon
