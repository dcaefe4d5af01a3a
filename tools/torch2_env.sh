#!/usr/bin/env bash
# A PyTorch 2.x environment on this Debian 12 machine: a chroot of Debian sid
# (python3-torch 2.x with FSDP2, DTensor, DCP and torch.optim.Muon, on the
# CPU with gloo), made with mmdebstrap and reused while current.
#
#   bash tools/torch2_env.sh make            # make or reuse; prints the root
#   bash tools/torch2_env.sh run CMD ARGS    # runs CMD inside, from /opt/muon
#
# `run` copies the repository's python/ (with the self-contained library in
# python/muonrt/lib, tools/graft_libs.py), tests/python/,
# examples/fashion_mnist_torch/ and the Fashion-MNIST data
# (/usr/share/datasets/fashion-mnist -> data/) into ROOT/opt/muon first, mounts /proc for the command and unmounts it after
# (also on failure or interruption).
# The root is $MUON_TORCH2_ROOT (default /var/cache/muon/torch2-root). It is
# current when its stamp names the same package list and it is younger than
# $MUON_TORCH2_MAX_AGE_DAYS (default 14); otherwise it is made again (about
# 2.5 minutes and 1.4 GB from deb.debian.org). Progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
root=${MUON_TORCH2_ROOT:-/var/cache/muon/torch2-root}
max_age_days=${MUON_TORCH2_MAX_AGE_DAYS:-14}
packages=python3-torch,python3-numpy,python3-pytest,libopenblas0-pthread
stamp=$root/.muon-torch2-stamp

current() {
  [[ -f $stamp ]] && [[ $(head -n 1 "$stamp") == "$packages" ]] &&
    [[ -n $(find "$stamp" -mtime "-$max_age_days" 2>/dev/null) ]]
}

make_root() {
  if current; then
    echo "torch2_env: reusing $root (made $(sed -n 2p "$stamp"))" >&2
    return
  fi
  command -v mmdebstrap >/dev/null || {
    echo "torch2_env: mmdebstrap not found (bash tools/setup.sh installs it)" >&2
    exit 1
  }
  echo "torch2_env: making $root (Debian sid with $packages; about 2.5 min)" >&2
  local staging="$root.new"
  rm -rf "$staging"
  mkdir -p "$(dirname "$root")"
  local start=$SECONDS
  mmdebstrap --variant=apt \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --include="$packages" sid "$staging" http://deb.debian.org/debian >&2
  printf '%s\n%s\n' "$packages" "$(date -u +%FT%TZ)" >"$staging/.muon-torch2-stamp"
  rm -rf "$root"
  mv "$staging" "$root"
  echo "torch2_env: made $root in $((SECONDS - start)) s" >&2
}

copy_in() {
  local dst=$root/opt/muon
  rm -rf "$dst"
  mkdir -p "$dst/tests" "$dst/tools"
  cp -a python "$dst/python"
  cp -a tests/python "$dst/tests/python"
  mkdir -p "$dst/examples" "$dst/data"
  cp -a examples/fashion_mnist_torch "$dst/examples/"
  cp -a tools/overlap_bench.py "$dst/tools/"
  if [[ -d /usr/share/datasets/fashion-mnist ]]; then
    cp -a /usr/share/datasets/fashion-mnist "$dst/data/"
  fi
  [[ -d python/muonrt/lib ]] || {
    echo "torch2_env: python/muonrt/lib is missing: run tools/graft_libs.py" >&2
    exit 1
  }
}

run_inside() {
  copy_in
  mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
  trap 'umount "$root/proc" 2>/dev/null || true' EXIT INT TERM
  chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    LANG=C.UTF-8 USE_LIBUV=0 PYTHONPATH=/opt/muon/python \
    PYTHONDONTWRITEBYTECODE=1 \
    /bin/sh -c 'cd /opt/muon && exec "$@"' sh "$@"
}

case ${1:-} in
  make)
    make_root
    echo "$root"
    ;;
  run)
    shift
    make_root
    run_inside "$@"
    ;;
  *)
    echo "usage: $0 make | run CMD [ARGS...]" >&2
    exit 2
    ;;
esac
