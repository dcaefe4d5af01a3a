#!/bin/bash
# Fails when a package depends on one it must not (see BUILD.bazel here).
# Arguments: the packages; each has //PKG:layering_deps (package_deps_query),
# one label per line of everything its libraries and binaries reach.
set -u
failed=0

# The project packages each package may depend on (itself always).
declare -A allowed=(
  [device]=""
  [common]="proto"
  [proto]=""
  [kernels]="common device"
  [checkpoint]="common"
  [plan]="common proto"
  [coordination]="proto"
  [comm]="common coordination device proto third_party"
  [server]="common coordination plan proto"
  [control]="comm common coordination device plan proto third_party"
  [client]="checkpoint comm common control coordination device kernels plan proto third_party"
  [capi]="checkpoint client comm common control coordination device kernels plan proto server third_party"
  [tools]="capi checkpoint client comm common control coordination device kernels plan proto server third_party"
)

for pkg in "$@"; do
  file="$pkg/layering_deps"
  if [[ ! -s $file ]]; then
    echo "FAIL: $file is missing or empty"
    failed=1
    continue
  fi
  if [[ ! -v allowed[$pkg] ]]; then
    echo "FAIL: //$pkg has no rule in layering_test.sh"
    failed=1
    continue
  fi
  ok=" $pkg ${allowed[$pkg]} "
  bad=""
  while read -r label; do
    dep=${label#//}
    dep=${dep%%[:/]*}
    [[ $label == //* && -n $dep ]] || continue  # external or //:setting
    [[ $ok == *" $dep "* ]] || bad+="  $label"$'\n'
  done <"$file"
  if [[ -n $bad ]]; then
    echo "FAIL: //$pkg may depend on ${allowed[$pkg]:-no other package}, but reaches:"
    printf '%s' "$bad"
    failed=1
  else
    echo "ok: //$pkg depends on ${allowed[$pkg]:-no other package} only ($(wc -l <"$file") targets)"
  fi
done

exit $failed
