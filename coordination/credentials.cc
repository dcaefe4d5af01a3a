#include "coordination/credentials.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace muon {
namespace {

constexpr size_t kMaxPemBytes = 1 << 20;

absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          size_t max_bytes, struct stat* st) {
  if (::stat(path.c_str(), st) != 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("no file ", path));
    }
    return absl::InternalError(
        absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st->st_mode) || static_cast<size_t>(st->st_size) > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is not a regular file of at most ", max_bytes, " bytes"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InternalError(absl::StrCat("cannot open ", path));
  std::ostringstream contents;
  contents << in.rdbuf();
  std::string text = contents.str();
  if (text.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " holds more than ", max_bytes, " bytes"));
  }
  return text;
}

}  // namespace

absl::StatusOr<std::string> GenerateSecret() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(
          absl::StrCat("getrandom failed: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  struct stat st;
  absl::StatusOr<std::string> text = ReadSmallFile(path, kMaxSecretBytes, &st);
  if (!text.ok()) return text.status();
  if ((st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "secret file %s has mode %04o; group and others must have no access "
        "(chmod 600 %s)",
        path, st.st_mode & 07777, path));
  }
  std::string secret(absl::StripTrailingAsciiWhitespace(*text));
  if (secret.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("secret file ", path, " is empty"));
  }
  for (char c : secret) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "secret file ", path, " holds a non-printable or space character"));
    }
  }
  return secret;
}

absl::Status WriteSecretFile(const std::string& path,
                             absl::string_view secret) {
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST) {
      return absl::AlreadyExistsError(absl::StrCat(path, " already exists"));
    }
    return absl::InternalError(
        absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  const std::string line = absl::StrCat(secret, "\n");
  size_t written = 0;
  while (written < line.size()) {
    const ssize_t n = ::write(fd, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string error = std::strerror(errno);
      ::close(fd);
      return absl::InternalError(
          absl::StrCat("cannot write ", path, ": ", error));
    }
    written += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot close ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status CheckJobSecret(absl::string_view secret,
                            absl::string_view source) {
  if (absl::StripAsciiWhitespace(secret).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " is ", secret.empty() ? "empty" : "only whitespace",
        ": a blank job secret would turn authentication off; set it to the "
        "job's secret (e.g. $(openssl rand -hex 32)), the same on every "
        "node, or leave it unset"));
  }
  if (secret.size() > kMaxSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " is ", secret.size(), " bytes; at most ", kMaxSecretBytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSecretSource> ChooseJobSecretSource(const char* value,
                                                      const char* file) {
  const auto blank = [](const char* v) {
    return v == nullptr || absl::StripAsciiWhitespace(v).empty();
  };
  if (!blank(value)) return JobSecretSource::kValue;
  if (!blank(file)) return JobSecretSource::kFile;
  if (value == nullptr && file == nullptr) return JobSecretSource::kNone;
  return absl::InvalidArgumentError(absl::StrCat(
      value != nullptr ? "MUON_JOB_SECRET" : "MUON_JOB_SECRET_FILE",
      " is set but empty, and no other job secret is set: a blank secret "
      "would turn authentication off; set MUON_JOB_SECRET (e.g. "
      "$(openssl rand -hex 32)) or MUON_JOB_SECRET_FILE (mode 0600), or "
      "leave both unset"));
}

absl::StatusOr<std::string> JobSecretFromEnv() {
  const char* value = std::getenv("MUON_JOB_SECRET");
  const char* file = std::getenv("MUON_JOB_SECRET_FILE");
  absl::StatusOr<JobSecretSource> source = ChooseJobSecretSource(value, file);
  if (!source.ok()) return source.status();
  if (*source == JobSecretSource::kNone) return std::string();
  if (*source == JobSecretSource::kValue) {
    const std::string secret(absl::StripAsciiWhitespace(value));
    absl::Status valid = CheckJobSecret(secret, "MUON_JOB_SECRET");
    if (!valid.ok()) return valid;
    return secret;
  }
  absl::StatusOr<std::string> secret = ReadSecretFile(file);
  if (!secret.ok()) {
    return absl::Status(
        secret.status().code(),
        absl::StrCat("MUON_JOB_SECRET_FILE: ", secret.status().message()));
  }
  return secret;
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path) {
  struct stat st;
  absl::StatusOr<std::string> text = ReadSmallFile(path, kMaxPemBytes, &st);
  if (!text.ok()) return text.status();
  if (text->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("PEM file ", path, " is empty"));
  }
  return text;
}

std::string BearerValue(absl::string_view token) {
  return absl::StrCat("Bearer ", token);
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

}  // namespace muon
