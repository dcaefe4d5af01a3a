// Helpers shared by the fuzz targets: a private scratch directory per
// process (in /dev/shm when it exists) for the readers that take paths.
#ifndef MUON_FUZZ_FUZZ_UTIL_H_
#define MUON_FUZZ_FUZZ_UTIL_H_

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace muon_fuzz {

// A directory removed (with the files the target names) at exit.
inline const std::string& ScratchDir() {
  static const std::string* dir = [] {
    const char* base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string templ = std::string(base) + "/muon-fuzz-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) {
      perror("mkdtemp");
      abort();
    }
    auto* d = new std::string(templ);
    return d;
  }();
  return *dir;
}

// Writes `size` bytes to `path` (truncating); aborts on an I/O error (the
// harness's fault, not the code under test).
inline void WriteFileOrDie(const std::string& path, const uint8_t* data,
                           size_t size) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) {
    perror(path.c_str());
    abort();
  }
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) {
      perror(path.c_str());
      abort();
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
}

// Removes the scratch directory and the files named in `files`.
inline void RemoveScratch(const char* const* files, int n) {
  for (int i = 0; i < n; ++i) {
    unlink((ScratchDir() + "/" + files[i]).c_str());
  }
  rmdir(ScratchDir().c_str());
}

}  // namespace muon_fuzz

#endif  // MUON_FUZZ_FUZZ_UTIL_H_
