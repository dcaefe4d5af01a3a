// muonctl: see tools/muonctl_lib.h.
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "tools/muonctl_lib.h"

int main(int argc, char** argv) {
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> args(positional.begin() + 1, positional.end());
  return muon::RunMuonctl(args, std::cout, std::cerr);
}
