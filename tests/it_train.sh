#!/usr/bin/env bash
# Integration test of `rk train` as a user runs it: usage errors (exit 2, nothing written),
# broken data files, learning well above chance on a subset of real Fashion-MNIST, bitwise
# determinism for a fixed seed, and a save/load round trip through safetensors.
# Needs: RK (the rk binary), RK_SRC (source tree), RK_TMP (scratch). Skips (77) without data.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_need_data
it_init it_train

# expect_usage NAME PATTERN ARGS...: exit status 2 and PATTERN in stderr.
expect_usage() {
  local name=$1 pattern=$2; shift 2
  "$RK" "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  if [[ $rc -eq 2 ]] && grep -q -- "$pattern" "$work/err"; then ok "$name"
  else bad "$name (exit $rc, stderr: $(head -c 300 "$work/err"))"; fi
}

expect_usage "no command" "usage: rk"
expect_usage "unknown command" "unknown command" frobnicate
expect_usage "unknown flag" "usage: rk train" train --bogus
expect_usage "flag without value" "usage: rk train" train --epochs
expect_usage "non-numeric epochs" "--epochs 'abc'" train --epochs abc
expect_usage "zero batch" "--batch '0'" train --batch 0
expect_usage "negative lr" "--lr '-1'" train --lr -1
expect_usage "unknown model" "--model 'resnet'" train --model resnet
expect_usage "unknown optimizer" "--optimizer 'lbfgs'" train --optimizer lbfgs
expect_usage "stray argument" "unexpected argument" train extra
expect_usage "missing data dir" "$work/nope" train --data "$work/nope" --max-steps 1
expect_usage "save path in a missing directory" "does not exist: create it first" train --save "$work/no/such/dir/w.safetensors"
if "$RK" train --help | grep -q -- "--max-steps"; then ok "--help lists flags"; else bad "--help"; fi

# A subset of the real data, raw IDX (the default directory is gzip: both paths get used).
python3 "$RK_SRC/tests/make_subset.py" "$DATA" "$work/sub" 6000 1000 || { bad "make subset"; exit 1; }

# Broken data: truncated images, and labels from another file. Exit 2, file named.
mkdir -p "$work/broken"
cp "$work/sub/"* "$work/broken/"
head -c 100000 "$work/sub/train-images-idx3-ubyte" >"$work/broken/train-images-idx3-ubyte"
expect_usage "truncated image file" "train-images-idx3-ubyte" train --data "$work/broken" --max-steps 1
cp "$work/sub/train-images-idx3-ubyte" "$work/broken/"
cp "$work/sub/t10k-labels-idx1-ubyte" "$work/broken/train-labels-idx1-ubyte"
expect_usage "image/label count mismatch" "train-" train --data "$work/broken" --max-steps 1

# Learning: 2 epochs of mlp on 6,000 images must be far above chance (0.10) on 1,000 tests.
common=(--data "$work/sub" --threads 2)
if "$RK" train --model mlp --epochs 2 --seed 3 "${common[@]}" --metrics-json "$work/m1.json" \
     --save "$work/w.safetensors" >"$work/train.log" 2>&1; then
  acc=$(json "$work/m1.json" test_accuracy)
  if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > 0.70 else 1)" "$acc"; then
    ok "mlp learns: test accuracy $acc > 0.70"
  else bad "mlp accuracy $acc <= 0.70"; fi
  missing=""
  for key in model epochs steps test_accuracy final_train_loss train_samples_per_s \
             peak_rss_bytes weights_xxh64; do
    json "$work/m1.json" "$key" >/dev/null 2>&1 || missing="$missing $key"
  done
  if [[ -z "$missing" ]]; then ok "metrics JSON has the required keys"
  else bad "metrics JSON lacks:$missing"; fi
else
  bad "mlp training failed: $(tail -3 "$work/train.log")"
fi

# Determinism: same seed and flags -> same weights; another seed -> other weights.
run_hash() {
  "$RK" train "$@" "${common[@]}" --no-eval --metrics-json "$work/h.json" >/dev/null 2>&1 &&
    json "$work/h.json" weights_xxh64
}
for model in mlp cnn-small cnn; do
  h1=$(run_hash --model $model --max-steps 12 --seed 5)
  h2=$(run_hash --model $model --max-steps 12 --seed 5)
  h3=$(run_hash --model $model --max-steps 12 --seed 6)
  if [[ -n "$h1" && "$h1" == "$h2" && "$h1" != "$h3" ]]; then ok "$model deterministic ($h1)"
  else bad "$model determinism: $h1 / $h2 / other seed $h3"; fi
done

# Save/load: Python reads the file; --init + --epochs 0 gives the same weights and accuracy.
if python3 "$RK_SRC/tests/st_read.py" "$work/w.safetensors" >"$work/st.txt" 2>&1 &&
   grep -q "fc1.weight F32 \[256,784\]" "$work/st.txt"; then ok "safetensors readable by a Python reader"
else bad "python reader: $(head -5 "$work/st.txt")"; fi
if "$RK" train --model mlp --init "$work/w.safetensors" --epochs 0 "${common[@]}" \
     --metrics-json "$work/m2.json" >/dev/null 2>&1 &&
   [[ "$(json "$work/m1.json" weights_xxh64)" == "$(json "$work/m2.json" weights_xxh64)" ]] &&
   [[ "$(json "$work/m1.json" test_accuracy)" == "$(json "$work/m2.json" test_accuracy)" ]]; then
  ok "--init restores the saved weights and accuracy"
else bad "--init round trip"; fi
expect_usage "--init with another model's weights" "mlp" train --model cnn-small \
  --init "$work/w.safetensors" --epochs 0 "${common[@]}"
printf 'not a safetensors file' >"$work/junk.safetensors"
expect_usage "--init with a junk file" "junk.safetensors" train --model mlp \
  --init "$work/junk.safetensors" --epochs 0 "${common[@]}"

it_finish
