// Who may talk to the coordinator: per-job secrets and TLS settings shared by
// the coordinator (server/) and its clients (client/, tools/). No gRPC here.
//
// Every RPC carries a bearer token in the gRPC metadata entry
// `authorization: Bearer <token>` (kAuthorizationMetadataKey). The job
// secret grants every RPC (Join, Heartbeat, ReportStep, KeySet, KeyGet and
// the read-only views); a read-only token (muonctl's) grants only GetJob,
// GetPlan, GetJobSpec, GetAssignments, ListRanks and GetReports. Missing or
// wrong tokens get UNAUTHENTICATED with no detail; a read-only token on a rank
// RPC gets PERMISSION_DENIED.
//
// Secrets are 32 random bytes from the kernel (getrandom), hex-encoded.
// They travel to ranks through the environment (MUON_JOB_SECRET) or a file
// readable only by its owner (MUON_JOB_SECRET_FILE, mode 0600 or stricter).
#ifndef MUON_COORDINATION_CREDENTIALS_H_
#define MUON_COORDINATION_CREDENTIALS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muon {

// gRPC metadata key carrying "Bearer <token>" (lower case, as gRPC needs).
inline constexpr char kAuthorizationMetadataKey[] = "authorization";
// Longest secret or token accepted from a file or the environment, bytes.
inline constexpr size_t kMaxSecretBytes = 4096;

// What a server accepts. An empty job_secret disables authentication (only
// for in-process tests; the daemon and the embedded coordinator of a
// multi-process job always set one).
struct CoordinatorAuth {
  std::string job_secret;
  std::string read_token;  // empty: no read-only token
};

// TLS for the coordinator's gRPC endpoint (PEM files). Server side: cert and
// key; client side: the CA (root) certificate that signed the server's.
struct TlsFiles {
  std::string cert_file;
  std::string key_file;
  std::string ca_file;
};

// A new random secret: 64 hex characters (256 bits).
// Errors: Internal when the kernel's random source fails.
absl::StatusOr<std::string> GenerateSecret();

// Reads a secret or token from `path`: trailing whitespace trimmed, 1 to
// kMaxSecretBytes bytes.
// Errors: NotFound (no such file), PermissionDenied (group or others may
// read or write it: names the mode), InvalidArgument (empty, too long, or
// not printable ASCII), Internal (read error). Messages name the path, never
// the content.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

// Creates `path` with mode 0600 holding `secret` and a newline; fails if it
// exists (O_EXCL), so an existing file is never replaced.
// Errors: AlreadyExists, Internal (names the path and errno text).
absl::Status WriteSecretFile(const std::string& path, absl::string_view secret);

// Checks a job secret (or read-only token) given explicitly or read from
// the environment: at least one character that is not whitespace (a blank
// secret would turn authentication off, or be guessable), at most
// kMaxSecretBytes. `source` names where it came from (e.g.
// "MUON_JOB_SECRET").
// Errors: InvalidArgument naming `source` (never the content).
absl::Status CheckJobSecret(absl::string_view secret, absl::string_view source);

// Where the job secret comes from, given MUON_JOB_SECRET's and
// MUON_JOB_SECRET_FILE's values (null: unset): the value when it is not
// blank, else the file when its name is not blank, else none. A blank
// variable counts as unset next to a usable other one (`export VAR=`
// clears it), but alone it is an error: the launcher meant to share a
// secret, and none would turn authentication off.
enum class JobSecretSource { kNone, kValue, kFile };
// Errors: InvalidArgument naming the blank variable(s) when neither is
// usable but one is set.
absl::StatusOr<JobSecretSource> ChooseJobSecretSource(const char* value,
                                                      const char* file);

// The job secret from the environment as ChooseJobSecretSource picks it:
// MUON_JOB_SECRET (surrounding whitespace stripped), else the file named
// by MUON_JOB_SECRET_FILE (ReadSecretFile), else "" (neither set).
// Errors: ChooseJobSecretSource's; CheckJobSecret's; ReadSecretFile's,
// naming the variable.
absl::StatusOr<std::string> JobSecretFromEnv();

// Reads a whole PEM file (TLS certificates and keys), at most 1 MiB.
// Errors: NotFound, InvalidArgument (empty or too large), Internal.
absl::StatusOr<std::string> ReadPemFile(const std::string& path);

// "Bearer <token>" for the authorization metadata.
std::string BearerValue(absl::string_view token);

// Whether `a` equals `b`, in time that depends only on their lengths (no
// early exit on the first differing byte).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace muon

#endif  // MUON_COORDINATION_CREDENTIALS_H_
