// "host:port" for a listening address or a gRPC target.
#ifndef MUON_COMMON_HOST_PORT_H_
#define MUON_COMMON_HOST_PORT_H_

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace muon {

// "host:port", or "[host]:port" for an IPv6 literal (a host with a colon
// that is not already bracketed), e.g. "127.0.0.1:50051", "[::1]:50051".
inline std::string HostPort(const std::string& host, int port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace muon

#endif  // MUON_COMMON_HOST_PORT_H_
