#!/usr/bin/env bash
# Compressed gradients and mixed precision in `rk train` under real Open MPI processes:
# onebit on 4 ranks trains (the loss falls) while sending over 20x fewer gradient bytes than
# the plain allreduce; compressing the momentum (the default) with nearly lossless fp16 pieces
# follows the plain allreduce step by step, with and without the fp16 loss scaler; fp16 and bf16 train with fp32 master weights and report the loss
# scale; a run of onebit + fp16 stopped at a checkpoint and resumed ends with the same
# weights as one that never stopped (error-feedback residuals and the loss scaler are in the
# checkpoint); compression on one process and a warm-up run; bad flags are refused with
# exit 2. Skips (77) without mpirun or data.
set -u
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_need_data
it_init it_amp
python3 "$RK_SRC/tests/make_subset.py" "$DATA" "$work/sub" 4000 500 || { bad "make subset"; exit 1; }

# run NAME NP ARGS...: train with NP ranks (1 = no mpirun)
run() {
  local name=$1 np=$2; shift 2
  local cmd=("$RK" train --data "$work/sub" --threads 1 --seed 3 --model cnn-small
             --loss-log "$work/$name.loss" --metrics-json "$work/$name.json" "$@")
  if [[ $np -gt 1 ]]; then cmd=("${mpi[@]}" -np "$np" "${cmd[@]}"); fi
  "${cmd[@]}" >"$work/$name.out" 2>&1 || { bad "$name: exit $?: $(tail -3 "$work/$name.out")"; return 1; }
}
# falls NAME: mean loss of the last 10 steps is below 0.75 of the first 10's
falls() {
  python3 - "$work/$1.loss" <<'PY'
import sys
l = [float(x.split()[1]) for x in open(sys.argv[1])]
a, b = sum(l[:10]) / 10, sum(l[-10:]) / 10
print(f"loss {a:.3f} -> {b:.3f} over {len(l)} steps")
sys.exit(0 if b < 0.75 * a else 1)
PY
}

run none 4 --max-steps 60 --no-eval &&
run onebit 4 --max-steps 60 --no-eval --compress onebit &&
  if msg=$(falls onebit); then
    read -r ratio < <(python3 -c "import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2]))
print(a['grad_bytes_sent'] / b['grad_bytes_sent'])" "$work/none.json" "$work/onebit.json")
    if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > 20 else 1)" "$ratio"; then
      ok "onebit on 4 ranks trains ($msg) and sends ${ratio%.*}x fewer gradient bytes"
    else bad "onebit sends only ${ratio}x fewer bytes"; fi
  else bad "onebit does not train: $msg"; fi
run noef 4 --max-steps 60 --no-eval --compress onebit-noef && ok "onebit-noef runs: $(falls noef)"
run warm 4 --max-steps 30 --no-eval --compress fp16 --compress-warmup 10 &&
  grep -q "after 10 full-precision steps" "$work/warm.out" && ok "fp16 compression after a 10-step warm-up" ||
  bad "warm-up not reported: $(head -3 "$work/warm.out")"

for p in fp16 bf16; do
  run "p-$p" 1 --max-steps 80 --no-eval --precision $p &&
    if msg=$(falls "p-$p") && [[ "$(json "$work/p-$p.json" precision)" == "$p" ]]; then
      ok "--precision $p trains on one process ($msg), loss scale $(json "$work/p-$p.json" loss_scale)"
    else bad "--precision $p: $msg"; fi
done
# onebit and fp16 pieces compress each rank's share of the momentum by default; with fp16 pieces
# (nearly lossless) the run must follow the plain allreduce's loss step by step, also with the
# loss scaler in between: a momentum of the wrong size (0.45 instead of 0.9) is 0.55 off
# (measured), a right one 0.05-0.08 (chaos over 60 steps)
close() { # close A B: the largest relative gap between the per-step losses of runs A and B
  python3 - "$work/$1.loss" "$work/$2.loss" <<'PY'
import sys
a = [float(x.split()[1]) for x in open(sys.argv[1])]
b = [float(x.split()[1]) for x in open(sys.argv[2])]
n = min(len(a), len(b))
gap = max(abs(x - y) / y for x, y in zip(a[:n], b[:n]))
print(f"{gap:.3f} over {n} steps")
sys.exit(0 if n >= 50 and gap < 0.2 else 1)
PY
}
run fp16m 4 --max-steps 60 --no-eval --compress fp16 &&
  if grep -q "as fp16 (on the momentum)" "$work/fp16m.out" && [[ "$(json "$work/fp16m.json" compress_on)" == momentum ]] &&
     msg=$(close fp16m none); then ok "fp16 pieces of the momentum follow the plain allreduce (largest loss gap $msg)"
  else bad "fp16 on the momentum: ${msg:-not reported}: $(grep 'allreduced' "$work/fp16m.out")"; fi
run p16n 4 --max-steps 60 --no-eval --precision fp16 &&
run p16m 4 --max-steps 60 --no-eval --compress fp16 --precision fp16 &&
  if msg=$(close p16m p16n); then ok "... and with --precision fp16's loss scaler (largest loss gap $msg)"
  else bad "fp16 pieces of the momentum under the loss scaler: $msg"; fi
run obg 4 --max-steps 60 --no-eval --compress onebit --compress-on gradient &&
  [[ "$(json "$work/obg.json" compress_on)" == gradient ]] && ok "--compress-on gradient: $(falls obg)" ||
  bad "--compress-on gradient: $(grep 'allreduced' "$work/obg.out")"
[[ "$(json "$work/p-bf16.json" loss_scale)" == None ]] && ok "bf16 has no loss scale" || bad "bf16 loss scale"
# fp16 without loss scaling would lose these gradients: the scaler backs off from 2^15 only on
# overflow, so the run reports a scale and how many steps it skipped
[[ "$(json "$work/p-fp16.json" amp_skipped_steps)" =~ ^[0-9]+$ ]] && ok "fp16 reports skipped steps: $(json "$work/p-fp16.json" amp_skipped_steps)" || bad "skipped steps"

# exact resume: 80 steps straight vs 40, stop, resume to 80 (onebit residuals + fp16 scaler)
flags=(--no-eval --compress onebit --precision fp16 --ckpt-every 20)
run straight 4 --max-steps 80 --ckpt-dir "$work/ck1" "${flags[@]}" &&
run half 4 --max-steps 40 --ckpt-dir "$work/ck2" "${flags[@]}" &&
run resumed 4 --max-steps 80 --ckpt-dir "$work/ck2" --resume "${flags[@]}" &&
  if [[ "$(json "$work/straight.json" weights_xxh64)" == "$(json "$work/resumed.json" weights_xxh64)" ]]; then
    ok "onebit + fp16 stopped at step 40 and resumed: same weights as straight ($(json "$work/straight.json" weights_xxh64))"
  else bad "resume differs: $(json "$work/straight.json" weights_xxh64) vs $(json "$work/resumed.json" weights_xxh64)"; fi
if grep -rlq "comm.residuals" "$work/ck2" && grep -rlq "amp.scale" "$work/ck2"; then
  ok "checkpoints hold comm.residuals and the amp.* loss scaler tensors"
else bad "checkpoint items missing"; fi

# bad flags: exit 2, nothing run
expect2() {
  local what=$1; shift
  "$RK" train --data "$work/sub" "$@" >"$work/bad.out" 2>&1
  local st=$?
  if [[ $st -eq 2 ]] && grep -q "$what" "$work/bad.out"; then ok "refused ($*): $(head -1 "$work/bad.out")"
  else bad "$* -> exit $st: $(head -2 "$work/bad.out")"; fi
}
expect2 "'2bit'" --compress 2bit
expect2 "not momentum or gradient" --compress onebit --compress-on weights
expect2 "fp8" --precision fp8
expect2 "need --precision fp16" --loss-scale 1024
expect2 "need --precision fp16" --precision bf16 --hysteresis 2
expect2 "above --loss-scale" --precision fp16 --loss-scale 8 --loss-scale-min 16
expect2 "compress-warmup" --compress onebit --compress-warmup -1
it_finish
