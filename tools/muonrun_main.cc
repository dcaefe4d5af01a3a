// muonrun: torchrun's launcher without Python (see tools/muonrun_lib.h).
//   muonrun --nproc-per-node 4 bazel-bin/examples/train --epochs 1
//   muonrun --nnodes 2 --node-rank 0 --nproc-per-node 2
//       --master-addr 10.0.0.1 --master-port 29500 ./trainer  (one line)
#include <iostream>
#include <string>
#include <vector>

#include "tools/muonrun_lib.h"

int main(int argc, char** argv) {
  muon::InstallMuonrunSignalHandlers();
  return muon::MuonrunMain(std::vector<std::string>(argv + 1, argv + argc),
                           std::cout, std::cerr);
}
