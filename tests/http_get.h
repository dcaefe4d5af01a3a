// A plain-socket HTTP GET for tests that scrape a server on 127.0.0.1 (the
// coordinator's Prometheus endpoint).
#ifndef MUON_TESTS_HTTP_GET_H_
#define MUON_TESTS_HTTP_GET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace muon {
namespace testing {

// GET http://127.0.0.1:port/path (HTTP/1.0, Connection: close): the whole
// response (status line, headers and body), or "" on a socket error.
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        "GET " + path +
        " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (write(fd, request.data(), request.size()) ==
        static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
    }
  }
  close(fd);
  return response;
}

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_HTTP_GET_H_
