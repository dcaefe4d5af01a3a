// A TCP port on 127.0.0.1 that was free a moment ago, for tests that start
// a server process on a fixed port (bound, read back, closed: another
// process could take it before the server does, unlikely in a sandbox).
#ifndef MUON_TESTS_FREE_PORT_H_
#define MUON_TESTS_FREE_PORT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace muon {
namespace testing {

// The port, or 0 when no socket could be bound.
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_FREE_PORT_H_
