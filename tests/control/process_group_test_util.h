// Options of an in-process test job's process group: rank 0 embeds the
// coordinator on a port the kernel picks and publishes its address in a
// file the other ranks (threads of the same test) read.
#ifndef MUON_TESTS_CONTROL_PROCESS_GROUP_TEST_UTIL_H_
#define MUON_TESTS_CONTROL_PROCESS_GROUP_TEST_UTIL_H_

#include <string>

#include "absl/time/time.h"
#include "control/process_group.h"
#include "server/embedded_coordinator.h"

namespace muon {

// Options for `rank` of `world_size` ranks on this machine: Gloo, the
// embedded coordinator's address exchanged through the file `address_path`
// (FileAddressExchange), the job secret `secret`, and a 30 s timeout for
// every rendezvous.
inline ProcessGroupOptions LocalGroupOptions(int rank, int world_size,
                                             const std::string& address_path,
                                             const std::string& secret) {
  ProcessGroupOptions o;
  o.rank = rank;
  o.world_size = world_size;
  o.embed_coordinator = true;
  o.start_embedded_coordinator = StartEmbeddedCoordinator;
  o.embedded_port = 0;
  o.address_exchange = FileAddressExchange(address_path, 1);
  o.timeout = absl::Seconds(30);
  o.job_secret = secret;
  return o;
}

}  // namespace muon

#endif  // MUON_TESTS_CONTROL_PROCESS_GROUP_TEST_UTIL_H_
