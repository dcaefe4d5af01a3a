#!/usr/bin/env bash
# device_bundle.sh OUTDIR BINARY...
#
# Packs binaries built here for a GPU machine that has the NVIDIA driver,
# CUDA and NCCL but none of our Debian libraries: each BINARY into bin/ and
# the shared libraries ldd lists for it into lib/ of OUTDIR/bundle.tar.xz,
# leaving out glibc's and CUDA's own libraries (libcuda, libcudart,
# libcublas*, libnccl, ...), which come from the GPU machine.
# tools/device_run.sh (OUTDIR/run.sh, copied by tools/pack_device.sh)
# unpacks and runs them there. Prints the bundle's size.
set -euo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
out=$1
shift
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$out"
# The machine's own: the C library's parts and CUDA's.
system='^(linux-vdso|ld-linux|lib(c|m|dl|pthread|rt|resolv|util)\.so|libcuda\.so|libcudart|libcublas|libnccl|libnvidia|libcufft|libcurand|libcusolver|libcusparse|libnvrtc|libnvJitLink)'
for binary in "$@"; do
  if [[ ! -f $binary || ! -x $binary ]]; then
    echo "device_bundle: $binary is not an executable" >&2
    exit 1
  fi
  cp -L "$binary" "$stage/bin/"
  while read -r name _ path _; do
    [[ -n ${path:-} && $path == /* && ! $name =~ $system ]] || continue
    cp -Ln "$path" "$stage/lib/" 2>/dev/null || true
  done < <(ldd "$binary")
done
tar -C "$stage" -cJf "$out/bundle.tar.xz" bin lib
echo "device_bundle: $out/bundle.tar.xz is $(du -sh "$out/bundle.tar.xz" | cut -f1)"
