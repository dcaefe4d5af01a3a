// muonctl: plan offline and inspect a live job. A thin main
// (tools/muonctl_main.cc) over this testable library with a command table
// (grpc_cli's pattern).
//
//   muonctl plan --spec FILE [--policy lpt|round_robin] [--json]
//   muonctl assignments --coordinator HOST:PORT [--json]
//   muonctl status --coordinator HOST:PORT [--json]
//   muonctl validate --spec FILE --steps K [--init DIR] [--grads DIR]
//                    [--dump DIR] [--coordinator HOST:PORT] [--tolerance X]
#ifndef MUON_TOOLS_MUONCTL_LIB_H_
#define MUON_TOOLS_MUONCTL_LIB_H_

#include <ostream>
#include <string>
#include <vector>

namespace muon {

// Runs one muonctl command; `args` are the positional arguments after the
// program name (flags are read from absl flags, parsed by main). Returns
// the process exit code: 0 ok, 1 failure (printed to `err`), 2 usage.
int RunMuonctl(const std::vector<std::string>& args, std::ostream& out,
               std::ostream& err);

}  // namespace muon

#endif  // MUON_TOOLS_MUONCTL_LIB_H_
