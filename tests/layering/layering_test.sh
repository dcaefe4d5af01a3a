#!/bin/bash
# Fails when a package depends on one it must not (see BUILD.bazel here).
set -u
dir="tests/layering"
failed=0

# forbid FILE REGEX WHY: no line of FILE (one target per line) matches REGEX.
forbid() {
  local file="$dir/$1" regex="$2" why="$3"
  if [[ ! -s "$file" ]]; then
    echo "FAIL: $file is missing or empty"
    failed=1
    return
  fi
  local hits
  hits=$(grep -E "$regex" "$file")
  if [[ -n "$hits" ]]; then
    echo "FAIL: $why:"
    echo "$hits" | sed 's/^/  /'
    failed=1
  else
    echo "ok: $why"
  fi
}

forbid plan_deps '^//(server|client)[:/]' "//plan depends on neither //server nor //client"
forbid coordination_deps '^//(server|client)[:/]' "//coordination depends on neither //server nor //client"
forbid server_deps '^//client[:/]' "//server does not depend on //client"
forbid client_deps '^//server[:/]' "//client (process group, Muon, agent, gRPC client) does not depend on //server"
forbid comm_deps '^//(server|client|kernels|plan)[:/]' "//comm (communicators) depends on none of //client, //server, //kernels, //plan"
forbid device_deps '^//(server|client|kernels|plan|comm|coordination|common|proto)[:/]' "//device depends on no other package of the project"
exit $failed
