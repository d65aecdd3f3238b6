#!/usr/bin/env bash
# A PyTorch DDP job (examples/pytorch/train_fashion_mnist.py, gloo on CPU, deterministic)
# under `rk run --launcher local`, 2 ranks: through an injected crash, NaN, bit flip in a
# parameter, gradient flip, hang (short --heartbeat-timeout) and collective failure, the run
# finishes with the parameters of an uninterrupted run, bit for bit; the hung rank's Python
# stack is in rk run's log before the hang is reported; `rk ckpt verify` accepts the job's
# store and detects a flipped byte, and a resume falls back past it to the same weights.
# The 4-rank faults, a SIGKILL by pid and the quarantine are in it_pytorch_ranks.sh.
# Skips (77) without a python3 that has torch, numpy and xxhash, or without Fashion-MNIST.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
py=$("$RK_SRC/tests/pyfind.sh" torch xxhash numpy) || { echo "$py"; exit 77; }
it_need_data
it_init it_pytorch
cd "$work" || exit 1
ex=("$py" "$RK_SRC/examples/pytorch/train_fashion_mnist.py" --subset 2048 --batch 32 --ckpt-every 20
    --hash-every 10 --data "$DATA")
run=("$RK" run --launcher local --heartbeat-timeout 5 --startup-timeout 300)

# the uninterrupted run (supervised, no checkpoints)
"${run[@]}" -n 2 -- "${ex[@]}" --steps 100 --result ref.json >ref.log 2>&1 \
  && ok "uninterrupted 2-rank run" || bad "uninterrupted run: $(tail -5 ref.log)"
ref=$(json ref.json hash 2>/dev/null)

spec='crash@step=25:rank=1,nan@step=33,bitflip@step=45:rank=1,gradflip@step=52:rank=1,hang@step=64:rank=1,commfail@step=78:rank=0'
t0=$(date +%s.%N)
"${run[@]}" -n 2 --ckpt-dir ck --events ev.jsonl --summary-json sum.json --failure-threshold 100 \
  --inject "$spec" -- "${ex[@]}" --steps 100 --result out.json >run.log 2>&1
st=$?
[[ $st == 0 ]] && ok "rk run finished through six faults ($(printf '%.1f' "$(echo "$(date +%s.%N) - $t0" | bc)") s)" \
  || bad "rk run exit $st: $(tail -8 run.log)"
got=$(json out.json hash 2>/dev/null)
[[ -n "$ref" && "$got" == "$ref" ]] && ok "final parameters hash $got equals the uninterrupted run's" \
  || bad "final hash '$got' differs from the uninterrupted run's '$ref'"

it_count "$py" - ev.jsonl sum.json run.log <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
kinds = [e["kind"] for e in ev]
def check(c, msg):
    print(("ok - " if c else "FAIL - ") + msg + ("" if c else f" (events: {kinds})"))
for k, act in (("crash", "relaunch"), ("hang", "relaunch"), ("commfail", "relaunch"), ("nan", "redo"),
               ("replica_mismatch", "rollback"), ("grad_suspect", "redo"), ("grad_outlier", "redo")):
    check(any(e["kind"] == k and e["action"] == act for e in ev), f"event {k} with action {act}")
crash = [e for e in ev if e["kind"] == "crash"]
check(len(crash) == 1 and crash[0]["rank"] == 1, "the crash is rank 1's")
hang = [e for e in ev if e["kind"] == "hang"]
check(len(hang) == 1 and hang[0]["rank"] == 1 and hang[0].get("stacks"), "the hang names rank 1 and its stacks file")
check(sum(1 for e in ev if e["kind"] == "inject") == 6, "six injections logged")
s = json.load(open(sys.argv[2]))
check(s["outcome"] == "finished" and s["restarts"] == 3 and s["steps"] == 100, f"summary: {s['outcome']}, {s['restarts']} restarts, {s['steps']} steps")
log = open(sys.argv[3]).read().splitlines()
st = [i for i, l in enumerate(log) if "injected_hang_sleeping_forever" in l and "rank 1 |" in l]
hg = [i for i, l in enumerate(log) if "hang: rank 1" in l]
check(st and hg and st[0] < hg[0], "the hung rank's Python stack (injected_hang_sleeping_forever) is in the log before the hang line")
PY

# the store: rk ckpt verify accepts it, detects a flipped byte, and a resume falls back past it
"$RK" ckpt verify ck >verify.out 2>&1 && ok "rk ckpt verify accepts the PyTorch job's store" \
  || bad "rk ckpt verify: $(cat verify.out)"
latest=$(cat ck/latest)
"$py" - "ck/$latest" <<'PY'
import struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
b[8 + n + 100] ^= 0x10  # a byte of the first tensor's data
open(p, "wb").write(b)
PY
"$RK" ckpt verify ck >verify2.out 2>&1
st=$?
[[ $st == 1 ]] && grep -q "checksum mismatch" verify2.out && grep -q "fall back to .*step 80" verify2.out \
  && ok "rk ckpt verify detects the flipped byte in $latest (exit 1, falls back to step 80)" \
  || bad "verify after the flip: exit $st: $(cat verify2.out)"
"${run[@]}" -n 2 --ckpt-dir ck -- "${ex[@]}" --steps 100 --result again.json >again.log 2>&1 \
  && grep -q "resumed from ck/ckpt-000000000080.safetensors" again.log \
  && ok "the resume skipped the corrupt checkpoint and resumed from step 80" \
  || bad "resume past the flipped checkpoint: $(tail -5 again.log)"
[[ "$(json again.json hash 2>/dev/null)" == "$ref" ]] && ok "and ended with the uninterrupted run's parameters" \
  || bad "hash after the fallback differs"
ls ck | grep -q "ckpt-000000000100.safetensors.bad-" && ok "the corrupt file was moved aside, not deleted" \
  || bad "no moved-aside file: $(ls ck)"

# SIGINT to rk run: the ranks checkpoint at the next step boundary, say bye stopped, exit 4
"${run[@]}" -n 2 --ckpt-dir cks --inject 'slow@step=0:ms=50' -- "${ex[@]}" --steps 100000 --ckpt-every 1000 \
  >stop.log 2>&1 &
sup=$!
pids+=("$sup")
# rank 0 says the global batch once its first step is done (both ranks said hello before it)
for ((i = 0; i < 1200; i++)); do grep -q "global batch" stop.log && break; sleep 0.05; done
kill -INT "$sup"
wait "$sup"
st=$?
at=$(sed -n 's/.*stopped on command at step \([0-9]*\) with its checkpoint saved.*/\1/p' stop.log)
[[ $st == 130 && -n "$at" && "$(cat cks/latest 2>/dev/null)" == "$(printf 'ckpt-%012d.safetensors' "$at")" ]] \
  && ok "stopped on SIGINT: checkpoint of step $at, rk run exit 130" \
  || bad "stop: exit $st, step '$at', latest $(cat cks/latest 2>/dev/null): $(tail -5 stop.log)"
it_finish
