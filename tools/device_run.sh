#!/usr/bin/env bash
# The bundle's launcher on the GPU machine, copied over the run.sh that
# ../shared/tools/device-bundle.sh writes (tools/pack_device.sh does it).
# Same contract: unpacks bundle.tar.xz beside it once into /tmp/muon-bundle
# and execs its arguments ('bin/NAME' is the bundled binary) with the
# bundle's libraries plus this machine's CUDA and NCCL libraries. Unlike
# that run.sh it resolves the CUDA/NCCL library folders once (cached in
# /tmp/muon-bundle/ld_library_path; delete it to resolve again), looks in
# /usr/local/cuda and PyTorch's own nvidia wheels before scanning the
# filesystem, and prints what it chose the first time (stderr).
here=$(cd "$(dirname "$0")" && pwd)
dest=/tmp/muon-bundle
# A stamp written after unpacking: tar gives bin/ the archive's (older)
# mtimes, so comparing with bin/ would unpack again on every call.
stamp=$dest/.unpacked
if [[ ! -f $stamp || $here/bundle.tar.xz -nt $stamp ]]; then
  staging=$(mktemp -d /tmp/muon-bundle.XXXXXX) &&
    tar -C "$staging" -xJf "$here/bundle.tar.xz" &&
    touch "$staging/.unpacked" || exit 1
  rm -rf "$dest" && mv "$staging" "$dest" || exit 1
fi
cache=$dest/ld_library_path
if [[ ! -s $cache ]]; then
  dirs=()
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [[ -d $d ]] && dirs+=("$d")
  done
  # PyTorch's pip wheels carry NCCL, cuBLAS and the runtime under
  # site-packages/nvidia/*/lib.
  wheels=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' \
    2>/dev/null)
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    found=""
    for d in "${dirs[@]}"; do
      [[ -e $d/$lib ]] && found=$d/$lib && break
    done
    if [[ -z $found && -n $wheels ]]; then
      # shellcheck disable=SC2086
      found=$(find $wheels -path '*/nvidia/*' -name "$lib" 2>/dev/null |
        head -n 1)
    fi
    if [[ -z $found ]]; then
      found=$(find / -xdev -name "$lib" -not -path '/proc/*' 2>/dev/null |
        head -n 1)
    fi
    if [[ -n $found ]]; then
      echo "run.sh: $lib -> $found" >&2
      d=$(dirname "$found")
      [[ " ${dirs[*]} " == *" $d "* ]] || dirs+=("$d")
    else
      echo "run.sh: $lib not found on this machine" >&2
    fi
  done
  path=$dest/lib
  for d in "${dirs[@]}"; do path=$path:$d; done
  echo "$path" >"$cache"
  echo "run.sh: LD_LIBRARY_PATH=$path (cached in $cache)" >&2
fi
resolved=$(cat "$cache")
export LD_LIBRARY_PATH=$resolved${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cmd=$1
shift
[[ $cmd == bin/* ]] && cmd=$dest/$cmd
exec "$cmd" "$@"
