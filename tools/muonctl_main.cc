// muonctl: see tools/muonctl_lib.h.
#include <iostream>
#include <string>
#include <vector>

#include "tools/muonctl_lib.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return muon::RunMuonctl(args, std::cout, std::cerr);
}
