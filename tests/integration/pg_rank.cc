// A rank program for the start-up tests, started by muonrun: joins the
// process group of torchrun's environment (ProcessGroupOptionsFromEnv; rank
// 0 embeds the coordinator), passes a barrier and exits 0; on an error it
// prints it on stderr and exits 1.
#include <iostream>
#include <memory>

#include "absl/time/time.h"
#include "control/process_group.h"
#include "server/embedded_coordinator.h"

int main() {
  absl::StatusOr<muon::ProcessGroupOptions> options =
      muon::ProcessGroupOptionsFromEnv();
  if (!options.ok()) {
    std::cerr << "pg_rank: " << options.status() << "\n";
    return 1;
  }
  options->start_embedded_coordinator = muon::StartEmbeddedCoordinator;
  options->timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<muon::ProcessGroup>> pg =
      muon::InitProcessGroup(*options);
  absl::Status status = pg.ok() ? (*pg)->comm->Barrier() : pg.status();
  if (!status.ok()) {
    std::cerr << "pg_rank: rank " << options->rank << ": " << status << "\n";
    return 1;
  }
  return 0;
}
