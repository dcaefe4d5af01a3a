#include "common/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace muon {

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

ScopedFd::~ScopedFd() { Close(); }

int ScopedFd::Close() {
  int err = 0;
  if (fd_ >= 0 && ::close(fd_) != 0) err = errno;
  fd_ = -1;
  return err;
}

std::string JoinPath(const std::string& dir, absl::string_view file) {
  if (!dir.empty() && dir.back() == '/') return absl::StrCat(dir, file);
  return absl::StrCat(dir, "/", file);
}

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

absl::StatusOr<ScopedFd> OpenForRead(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(errno, "opening", path);
  return ScopedFd(fd);
}

absl::StatusOr<int64_t> FileSize(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "stat of", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a regular file"));
  }
  return static_cast<int64_t>(st.st_size);
}

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
    return absl::InvalidArgumentError(
        absl::StrCat("path ", dir, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

namespace {

// Writes `pieces` to the new file `tmp`, fsyncs and closes it.
absl::Status WriteSynced(const std::string& tmp,
                         const std::vector<FilePiece>& pieces) {
  int raw;
  do {
    raw = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  } while (raw < 0 && errno == EINTR);
  if (raw < 0) return ErrnoStatus(errno, "creating", tmp);
  ScopedFd fd(raw);
  for (const FilePiece& p : pieces) {
    absl::Status status = WriteAll(fd.get(), p.data, p.size, tmp);
    if (!status.ok()) return status;
  }
  if (::fsync(fd.get()) != 0) return ErrnoStatus(errno, "syncing", tmp);
  if (const int err = fd.Close(); err != 0) {
    return ErrnoStatus(err, "closing", tmp);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AtomicWriteFile(const std::string& dir, absl::string_view file,
                             const std::vector<FilePiece>& pieces) {
  static std::atomic<uint64_t> counter{0};
  const std::string path = JoinPath(dir, file);
  const std::string tmp =
      absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  absl::Status status = WriteSynced(tmp, pieces);
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

}  // namespace muon
