#!/usr/bin/env bash
# 4 ranks of the PyTorch example (examples/pytorch/train_fashion_mnist.py, gloo on CPU) under
# `rk run --launcher local`: a SIGKILL of one rank by its pid (found in rk run's process
# tree, never a pid a worker reported), then an injected NaN, bit flip, crash, hang and
# collective failure; the run ends with the uninterrupted 4-rank run's parameters, bit for
# bit, and the bit flip is blamed on its rank by the majority. Then a device whose rank has
# two injected crashes is quarantined and the job finishes on the 3 ranks left with the
# global batch kept.
# Skips (77) without a python3 that has torch, numpy and xxhash, or without Fashion-MNIST.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
py=$("$RK_SRC/tests/pyfind.sh" torch xxhash numpy) || { echo "$py"; exit 77; }
it_need_data
it_init it_pytorch_ranks
cd "$work" || exit 1
ex=("$py" "$RK_SRC/examples/pytorch/train_fashion_mnist.py" --subset 2048 --batch 32 --hash-every 10
    --data "$DATA")
run=("$RK" run --launcher local --heartbeat-timeout 5 --startup-timeout 300)

"${run[@]}" -n 4 -- "${ex[@]}" --steps 60 --result ref.json >ref.log 2>&1 \
  && ok "uninterrupted 4-rank run" || bad "uninterrupted run: $(tail -5 ref.log)"
ref=$(json ref.json hash 2>/dev/null)

# launch 0 is paced (rank 0 sleeps 100 ms a step until step 33) so that the SIGKILL, sent
# once the checkpoint of step 20 or 30 is there, lands before the injected faults' steps
spec='slow@step=0:rank=0:ms=100:for=33,nan@step=34:rank=3,bitflip@step=37:rank=2,crash@step=42:rank=2,hang@step=44:rank=1,commfail@step=52:rank=3'
"${run[@]}" -n 4 --ckpt-dir ck --events ev.jsonl --summary-json sum.json --failure-threshold 100 \
  --inject "$spec" -- "${ex[@]}" --steps 60 --ckpt-every 10 --result out.json >run.log 2>&1 &
sup=$!
pids+=("$sup")
killed=
for ((i = 0; i < 1200; i++)); do
  at=$(cat ck/latest 2>/dev/null)
  if [[ "$at" == ckpt-0000000000[23]0.safetensors ]]; then
    victim=$(rank_pid "$sup" 3 train_fashion_mnist.py) && kill -9 "$victim" && killed=$victim
    break
  fi
  sleep 0.05
done
[[ -n "$killed" ]] && ok "SIGKILL to rank 3 (pid $killed, from rk run's process tree) after $at" \
  || bad "no rank 3 to kill after the checkpoint of step 20 or 30"
wait "$sup"
st=$?
[[ $st == 0 ]] && ok "rk run finished the 4-rank job" || bad "rk run exit $st: $(tail -8 run.log)"
got=$(json out.json hash 2>/dev/null)
[[ -n "$ref" && "$got" == "$ref" ]] && ok "final parameters hash $got equals the uninterrupted 4-rank run's" \
  || bad "final hash '$got' differs from the uninterrupted run's '$ref'"
it_count "$py" - ev.jsonl sum.json <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
kinds = [(e["kind"], e["rank"], e["action"]) for e in ev if e["kind"] != "inject"]
def check(c, msg):
    print(("ok - " if c else "FAIL - ") + msg + ("" if c else f" (events: {kinds})"))
crash = [e["rank"] for e in ev if e["kind"] == "crash"]
check(crash == [3, 2], f"crashes: the SIGKILL'ed rank 3, then the injected one of rank 2 ({crash})")
for k, r, act in (("hang", 1, "relaunch"), ("commfail", 3, "relaunch"), ("nan", 3, "redo"),
                  ("replica_mismatch", 2, "rollback")):
    check(any(e["kind"] == k and e["rank"] == r and e["action"] == act for e in ev),
          f"event {k} of rank {r}, action {act}")
s = json.load(open(sys.argv[2]))
check(s["outcome"] == "finished" and s["restarts"] == 4 and s["final_ranks"] == 4,
      f"summary: {s['outcome']}, {s['restarts']} restarts, {s['final_ranks']} ranks")
PY

# a device that fails twice is quarantined; the job goes on with 3 ranks, the same global batch
"${run[@]}" -n 4 --devices 0,1,2,3 --ckpt-dir ckq --summary-json sumq.json \
  --inject 'crash@step=15:rank=1,crash@step=30:rank=1' -- "${ex[@]}" --steps 50 --ckpt-every 10 \
  --result outq.json >q.log 2>&1
st=$?
[[ $st == 0 ]] && ok "the job finished after the quarantine" || bad "quarantine run exit $st: $(tail -8 q.log)"
it_count "$py" - sumq.json outq.json q.log <<'PY'
import json, sys
s, r, log = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), open(sys.argv[3]).read()
def check(c, msg):
    print(("ok - " if c else "FAIL - ") + msg)
check(s["final_ranks"] == 3 and s["quarantined"] == 1 and "device 1 quarantined after 2 failures" in log,
      f"device 1 quarantined after its two crashes, {s['final_ranks']} ranks at the end")
check(r["world"] == 3 and r["step"] == 50, f"the result was written by a 3-rank world at step {r['step']}")
check("written by 4 ranks; now 3" in log, "the 3 ranks resumed from the 4 ranks' checkpoint")
check("global batch 32 samples over 3 ranks" in log, "the 3 ranks' shares sum to the global batch of 32")
PY
it_finish
