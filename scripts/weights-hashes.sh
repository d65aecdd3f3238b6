#!/usr/bin/env bash
# Fixed-seed weights hashes of rk train (and a 2-rank onebit run under rk run): a refactor that
# claims "no numerical change" prints the same lines before and after.
#   scripts/weights-hashes.sh BUILD_DIR      (needs the Fashion-MNIST data of install-deps.sh)
# Prints "config sha256-prefix-of-the-saved-weights", or "config FAILED".
set -u
B=${1:?usage: scripts/weights-hashes.sh BUILD_DIR}
[[ -x "$B/rk" ]] || { echo "weights-hashes: no rk in $B" >&2; exit 2; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
run() {
  local name=$1; shift
  if "$B/rk" "$@" --save "$T/$name.st" --no-eval >/dev/null 2>&1; then
    echo "$name $(sha256sum <"$T/$name.st" | cut -c1-16)"
  else echo "$name FAILED"; fi
}
run mlp1 train --model mlp --threads 1 --max-steps 60 --seed 3
run cnns2 train --model cnn-small --threads 2 --max-steps 30 --seed 5
run cnn1 train --model cnn --threads 1 --max-steps 10 --seed 7
run fp16 train --model cnn-small --threads 1 --max-steps 30 --precision fp16 --seed 2
run adamw train --model mlp --threads 1 --max-steps 40 --optimizer adamw --batch-policy throughput --seed 4
if OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none \
   "$B/rk" run -n 2 --quiet --ckpt-dir "$T/ck" -- "$B/rk" train --model mlp --threads 1 \
   --max-steps 60 --compress onebit --ckpt-every 20 --save "$T/dp.st" --no-eval >/dev/null 2>&1; then
  echo "dp2onebit $(sha256sum <"$T/dp.st" | cut -c1-16)"
else echo "dp2onebit FAILED"; fi
