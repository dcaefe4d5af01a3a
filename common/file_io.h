// POSIX file helpers for files written and read whole by this library
// (checkpoints, their metadata): an owned file descriptor, errno mapped to
// absl::Status, full writes and positional reads that retry on EINTR, mkdir
// -p, and a crash-safe replace (write a temporary file, fsync, rename,
// fsync the directory; the pattern of LevelDB's and RocksDB's
// CURRENT-file updates).
//
// Thread-safety: the functions are safe to call concurrently on different
// files; ScopedFd is not shared between threads.
#ifndef MUON_COMMON_FILE_IO_H_
#define MUON_COMMON_FILE_IO_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muon {

// Owns a file descriptor (-1 = none); closes it on destruction.
class ScopedFd {
 public:
  explicit ScopedFd(int fd = -1) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd();

  int get() const { return fd_; }
  // Closes the descriptor; returns close's errno (0 when it succeeded or
  // there was none).
  int Close();

 private:
  int fd_;
};

// "DIR/FILE", with one '/' between them.
std::string JoinPath(const std::string& dir, absl::string_view file);

// errno `err` of the operation `what` (a verb phrase: "opening",
// "writing", ...) on `path`, with strerror's text: NotFound (ENOENT,
// ENOTDIR), PermissionDenied (EACCES, EPERM, EROFS), ResourceExhausted
// (ENOSPC, EDQUOT), else Internal.
absl::Status ErrnoStatus(int err, absl::string_view what,
                         const std::string& path);

// Opens `path` read-only (O_CLOEXEC). Errors: as ErrnoStatus ("opening").
absl::StatusOr<ScopedFd> OpenForRead(const std::string& path);

// Size in bytes of the regular file open as `fd` (`path` names it in
// errors). Errors: as ErrnoStatus; FailedPrecondition when it is not a
// regular file.
absl::StatusOr<int64_t> FileSize(int fd, const std::string& path);

// Reads up to `n` bytes at byte `offset` of `fd` into `buf` (host memory,
// at least `n` bytes), stopping early only at the end of the file; returns
// the bytes read. Errors: as ErrnoStatus ("reading").
absl::StatusOr<int64_t> PreadFull(int fd, void* buf, int64_t n, int64_t offset,
                                  const std::string& path);

// Writes all `n` bytes at `data` (host memory) to `fd`. Errors: as
// ErrnoStatus ("writing").
absl::Status WriteAll(int fd, const void* data, size_t n,
                      const std::string& path);

// mkdir -p `dir` (mode 0777 before the umask).
// Errors: as ErrnoStatus; InvalidArgument when `dir` exists and is not a
//   directory.
absl::Status MakeDirs(const std::string& dir);

// `size` bytes at `data` (host memory), one piece of a file's contents.
struct FilePiece {
  const void* data;
  size_t size;
};

// Replaces DIR/FILE with `pieces`, concatenated, so that a reader sees the
// old file or the new one whole: writes DIR/FILE.tmp.<pid>.<n>, fsyncs it,
// renames it over DIR/FILE, then fsyncs DIR (best effort: the rename is
// done either way). The temporary file is removed on failure.
// Errors: as ErrnoStatus (creating, writing, syncing, closing, renaming).
absl::Status AtomicWriteFile(const std::string& dir, absl::string_view file,
                             const std::vector<FilePiece>& pieces);

}  // namespace muon

#endif  // MUON_COMMON_FILE_IO_H_
