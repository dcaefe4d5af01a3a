#!/usr/bin/env bash
# Regenerates the committed seed corpus fuzz/corpus/<target>/ from the
# example and integration job specs (spec/, manifest/) and from the
# project's own writers (npy/, checkpoint/). Run after a format change.
set -euo pipefail
cd "$(dirname "$0")/.."
bash fuzz/build.sh >/dev/null
rm -rf fuzz/corpus
mkdir -p fuzz/corpus/{spec,manifest,npy,checkpoint}
specs=(examples/specs/*.json tests/integration/specs/*.json)
for s in "${specs[@]}"; do
  d=${s%/specs/*}; d=${d//\//_}
  cp "$s" "fuzz/corpus/spec/${d}_$(basename "$s")"
done
# Model-sized specs up to the spec target's -max_len (16 KiB).
for s in examples/specs/models/*.json; do
  if (( $(stat -c %s "$s") <= 16384 )); then cp "$s" fuzz/corpus/spec/; fi
done
fuzz/out/make_seeds fuzz/corpus "${specs[@]}"
echo "fuzz/make_seeds.sh: $(find fuzz/corpus -type f | wc -l) seeds in fuzz/corpus/"
