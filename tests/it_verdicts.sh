#!/usr/bin/env bash
# rk doctor and rk run's health gate say the same of the same GPUs: for one simulated fleet
# (the same seed, age and sim options, both read at the fleet's first reading, the start age)
# `rk doctor --json` and the gate of `rk run --health sim` give every GPU the same score and
# the same verdict. The gate's side is what rk run did with it: its --gate-log score, the
# devices it launched on (every GPU that passes: -n is the whole fleet, --min-ranks 1) and
# the ones it left out (event health_gate, with the worst finding's code, which must be
# doctor's worst finding). Three fleets: busy GPUs with the sensors fitted (seed 4, 12,000 h:
# healthy, warning and failing GPUs), idle GPUs with the sensors (seed 6, 20,000 h: the same
# three kinds), and the defaults (idle, NVML's fields only: healthy and warning GPUs). The
# checker compares every GPU, not a count, and is shown to catch one changed score.
# Needs python3 (the ranks are tests/launch_worker.py under --launcher local: no MPI, no data).
set -u
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_verdicts
N=8
devices=$(seq -s, 0 $((N - 1)))
worker=(python3 "$RK_SRC/tests/launch_worker.py" --steps 3)

# compare.py DOCTOR_JSON GATE_LOG EVENTS STEPS KINDS: one "ok - "/"FAIL - " line per check
cat >"$work/compare.py" <<'PY'
import json, sys
doc_path, gate_path, ev_path, steps_path, kinds = sys.argv[1:6]
doc = {g["index"]: g for g in json.load(open(doc_path))["gpus"]}
first = {}  # the gate's first reading of each device (before the first launch)
for line in open(gate_path):
    r = json.loads(line)
    first.setdefault(int(r["device"]), r)
left = {int(e["device"]): e for e in map(json.loads, open(ev_path))
        if e["kind"] == "health_gate" and e["action"] == "left_out"}
launch = next(r for r in map(json.loads, open(steps_path)) if r["type"] == "launch")
launched = {int(d) for d in launch["devices"]}
bad = []
if sorted(doc) != sorted(first) or not doc:
    bad.append(f"doctor read GPUs {sorted(doc)}, the gate {sorted(first)}")
seen = set()
for i in sorted(doc):
    d, g = doc[i], first.get(i)
    if g is None:
        continue
    codes = [f["code"] for f in d["findings"]]
    kind = "failed" if not d["pass"] else "warn" if d["score"] < 100 else "healthy"
    seen.add(kind)
    gate_pass = g["score"] >= g["threshold"] and not g["lost"]
    if d["score"] != g["score"]:
        bad.append(f"GPU {i}: doctor scores {d['score']}, the gate {g['score']}")
    if d["pass"] != gate_pass:
        bad.append(f"GPU {i}: doctor pass={d['pass']}, the gate's score {g['score']} "
                   f"against {g['threshold']}")
    if d["pass"] != (i in launched) or d["pass"] == (i in left):
        bad.append(f"GPU {i}: doctor pass={d['pass']}, rk run launched on it: {i in launched}, "
                   f"left it out: {i in left}")
    if i in left and codes and f"below 60: {codes[0]}:" not in left[i]["detail"]:
        bad.append(f"GPU {i}: doctor's worst finding {codes[0]}, the gate: {left[i]['detail']}")
want = set(kinds.split(","))
if not want <= seen:
    bad.append(f"the fleet has {sorted(seen)} GPUs, the test needs {sorted(want)}")
scores = ", ".join(f"{i}:{doc[i]['score']}" for i in sorted(doc))
for b in bad:
    print(f"FAIL - {b}")
if not bad:
    print(f"ok - {len(doc)} GPUs ({'/'.join(sorted(seen))}), the same score and verdict in "
          f"rk doctor and rk run's gate: {scores}; launched on {sorted(launched)}, "
          f"left out {sorted(left)}")
PY

# verdicts NAME SEED AGE KINDS [SIM FLAGS...]: doctor and the gate on the same fleet, compared.
# Both read every GPU first at the fleet's start (its clock starts at that reading; the
# microseconds between two GPUs' readings are nothing at doctor's 120x and less at the gate's
# 0.001x), and doctor reads once (--samples 1): the same readings.
verdicts() {
  local name=$1 seed=$2 age=$3 kinds=$4; shift 4
  "$RK" doctor --sim "$N" --seed "$seed" --age "$age" "$@" --samples 1 --json \
    >"$work/$name.doc.json" 2>"$work/$name.doc.err"
  local st=$?
  [[ $st == 0 || $st == 1 ]] || { bad "$name: rk doctor exit $st: $(head -3 "$work/$name.doc.err")"; return; }
  timeout 300 "$RK" run -n "$N" --min-ranks 1 --launcher local --devices "$devices" --health sim \
    --sim-seed "$seed" --sim-age "$age" --sim-time-scale 0.001 "$@" --gate-log "$work/$name.gate" \
    --events "$work/$name.ev" --steps "$work/$name.steps" --quiet -- "${worker[@]}" \
    >"$work/$name.run" 2>&1
  st=$?
  [[ $st == 0 ]] || { bad "$name: rk run exit $st: $(grep 'rk run' "$work/$name.run" | tail -3)"; return; }
  touch "$work/$name.ev"
  echo "$name ($*):"
  it_count python3 "$work/compare.py" "$work/$name.doc.json" "$work/$name.gate" "$work/$name.ev" \
    "$work/$name.steps" "$kinds"
}

verdicts busy 4 12000 healthy,warn,failed --sim-load busy --sim-sensors
verdicts idle-sensors 6 20000 healthy,warn,failed --sim-sensors
verdicts defaults 4 12000 healthy,warn

# the checker can fail: one GPU's score changed in doctor's report is caught, naming the GPU
python3 - "$work/busy.doc.json" "$work/bent.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["gpus"][2]["score"] += 5
json.dump(d, open(sys.argv[2], "w"))
PY
if python3 "$work/compare.py" "$work/bent.json" "$work/busy.gate" "$work/busy.ev" "$work/busy.steps" \
     healthy >"$work/bent.out" 2>&1 && grep -q "^FAIL - GPU 2: doctor scores" "$work/bent.out" &&
   ! grep -q "^ok - " "$work/bent.out"; then
  ok "the checker catches one GPU's changed score ($(grep -m1 '^FAIL' "$work/bent.out" | sed 's/^FAIL - //'))"
else
  bad "the checker missed a changed score: $(cat "$work/bent.out")"
fi
it_finish
