#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/*_fuzzer.cc) into fuzz/out/ with
# clang-14: -fsanitize=fuzzer,address,undefined (UB is fatal), -O1 -g.
# Bazel 4.2.3 with gcc cannot build libFuzzer binaries, so this compiles the
# library sources the targets need directly (objects cached in
# fuzz/out/obj/, rebuilt when a source or any header of the repo is newer)
# and generates the muon.v1 messages with Debian's protoc.
#
# Usage: fuzz/build.sh [TARGET...]   (default: every target; also builds
#        fuzz/out/make_seeds, the corpus seed generator)
# Needs: clang-14, libfuzzer-14-dev, protobuf-compiler, libprotobuf-dev,
#        libabsl-dev, nlohmann-json3-dev (tools/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${CXX:-clang++-14}
OUT=fuzz/out
OBJ=$OUT/obj
GEN=$OUT/gen
JOBS=${FUZZ_BUILD_JOBS:-2}

command -v "$CXX" >/dev/null || { echo "fuzz/build.sh: $CXX not found (apt-get install clang-14)"; exit 2; }
fuzzer_lib=$("$CXX" -print-file-name=libclang_rt.fuzzer-x86_64.a)
[[ -f $fuzzer_lib ]] || { echo "fuzz/build.sh: libFuzzer runtime missing (apt-get install libfuzzer-14-dev)"; exit 2; }

mkdir -p "$OBJ" "$GEN"
# Generated messages (same protoc invocation as //proto:coordinator_gen).
if [[ ! -f $GEN/muon/v1/coordinator.pb.cc || proto/muon/v1/coordinator.proto -nt $GEN/muon/v1/coordinator.pb.cc ]]; then
  protoc -Iproto --cpp_out="$GEN" proto/muon/v1/coordinator.proto
fi

SAN=(-fsanitize=address,undefined -fno-sanitize-recover=undefined)
CXXFLAGS=(-std=c++17 -O1 -g -fno-omit-frame-pointer -DNOMINMAX -I. -I"$GEN"
  -Wno-deprecated-declarations)
# The library code under test: everything the four targets reach. New .cc
# files in common/ and plan/ are picked up automatically.
LIB_SRCS=(common/*.cc plan/*.cc server/coordinator_service.cc server/coordinator_observer.cc server/kv_store.cc server/deadline_timer.cc
  checkpoint/checkpoint.cc tools/npy.cc)
LIBS=$(pkg-config --libs protobuf absl_status absl_statusor absl_strings \
  absl_str_format absl_synchronization absl_time absl_hash absl_raw_hash_set)

newest_header=$(find common plan server client tools "$GEN" -name '*.h' -newer "$OBJ/.stamp" 2>/dev/null | head -1 || true)
[[ -f $OBJ/.stamp ]] || newest_header=all

compile() {  # compile SRC OBJ FLAGS...
  local src=$1 obj=$2; shift 2
  if [[ -n $newest_header || ! -f $obj || $src -nt $obj ]]; then
    mkdir -p "$(dirname "$obj")"
    echo "  CXX $src"
    "$CXX" "${CXXFLAGS[@]}" "$@" -c "$src" -o "$obj"
  fi
}
export -f compile 2>/dev/null || true

# Library objects: coverage-instrumented (fuzzer-no-link) and sanitized.
objs=()
pids=()
for src in "${LIB_SRCS[@]}" "$GEN/muon/v1/coordinator.pb.cc"; do
  o=$OBJ/${src#$GEN/}; o=${o%.cc}.o
  objs+=("$o")
  # Generated code is not fuzzed for coverage (big, not ours): sanitizers only.
  if [[ $src == "$GEN"/* ]]; then flags=("${SAN[@]}"); else flags=("${SAN[@]}" -fsanitize=fuzzer-no-link); fi
  compile "$src" "$o" "${flags[@]}" &
  pids+=($!)
  if (( ${#pids[@]} >= JOBS )); then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p"; done
touch "$OBJ/.stamp"

targets=("$@")
if (( ${#targets[@]} == 0 )); then
  targets=()
  for f in fuzz/*_fuzzer.cc; do t=${f#fuzz/}; targets+=("${t%_fuzzer.cc}"); done
fi
for t in "${targets[@]}"; do
  src=fuzz/${t}_fuzzer.cc
  [[ -f $src ]] || { echo "fuzz/build.sh: no target $t ($src)"; exit 2; }
  compile "$src" "$OBJ/fuzz/${t}_fuzzer.o" "${SAN[@]}" -fsanitize=fuzzer
  echo "  LD  $OUT/${t}_fuzzer"
  # shellcheck disable=SC2086
  "$CXX" "${SAN[@]}" -fsanitize=fuzzer "$OBJ/fuzz/${t}_fuzzer.o" "${objs[@]}" $LIBS -lpthread -o "$OUT/${t}_fuzzer"
done
# The seed generator (no libFuzzer main).
if [[ -f fuzz/make_seeds.cc && $# -eq 0 ]]; then
  compile fuzz/make_seeds.cc "$OBJ/fuzz/make_seeds.o" "${SAN[@]}"
  # shellcheck disable=SC2086
  "$CXX" "${SAN[@]}" -fsanitize=fuzzer-no-link "$OBJ/fuzz/make_seeds.o" "${objs[@]}" $LIBS -lpthread -o "$OUT/make_seeds"
fi
echo "fuzz/build.sh: built ${targets[*]} in $OUT/"
