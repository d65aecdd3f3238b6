#!/usr/bin/env bash
# rk run, the supervisor, with real Open MPI ranks of `rk train`, real signals, sockets and
# files: (1) 4 ranks of cnn-small with a crash, a hang, a NaN, a bit flip in one replica's
# parameters, a flipped gradient exponent and a communication failure injected at fixed
# steps finish with the same weights_xxh64 as the fault-free run, and each incident is in
# the events file and the summary; (2) a device that crashes twice is quarantined and the job
# finishes on 3 ranks within 0.5 points of the fault-free test accuracy; (3) bad usage exits
# 2 and names the problem (a fault spec by its position). Skips (77) without mpirun or data.
set -u
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_need_data
it_init it_run
# the sandbox's Open MPI: shared memory without cross-memory attach
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none

python3 "$RK_SRC/tests/make_subset.py" "$DATA" "$work/sub" 6400 1000 || { bad "make subset"; exit 1; }
steps=200
worker=("$RK" train --data "$work/sub" --threads 1 --seed 3 --max-steps "$steps" --epochs 2
        --ckpt-every 25)

# sup NAME [rk run flags...]: supervise 4 ranks; output in NAME.out, events, summary, metrics
sup() {
  local name=$1; shift
  "$RK" run -n 4 --ckpt-dir "$work/$name.ck" --heartbeat-timeout 3 --quiet \
    --events "$work/$name.events" --summary-json "$work/$name.sum" "$@" \
    -- "${worker[@]}" --metrics-json "$work/$name.json" >"$work/$name.out" 2>&1
}

# --- fault-free reference -----------------------------------------------------------------
if sup ref; then ok "fault-free run under rk run finishes"
else bad "fault-free run: exit $?: $(tail -5 "$work/ref.out")"; it_finish; exit; fi
ref_hash=$(json "$work/ref.json" weights_xxh64)
ref_acc=$(json "$work/ref.json" test_accuracy)
[[ $(json "$work/ref.sum" restarts) == 0 ]] && ok "no restarts without faults" || bad "restarts without faults"

# --- every kind of fault at a fixed step --------------------------------------------------
spec="crash@step=30:rank=2,nan@step=55:rank=0,hang@step=80:rank=1,bitflip@step=105:rank=3"
spec+=",gradflip@step=130:rank=0,commfail@step=160:rank=3"
# two faults land on ranks 0 and 3: a threshold of 3 keeps every device in this run
if sup faults --inject "$spec" --failure-threshold 3; then ok "run with 6 injected faults finishes"
else bad "faults run: exit $?: $(tail -8 "$work/faults.out")"; fi
h=$(json "$work/faults.json" weights_xxh64 2>/dev/null)
[[ $h == "$ref_hash" ]] && ok "weights_xxh64 $h equals the fault-free run's" \
  || bad "weights_xxh64 $h differs from the fault-free $ref_hash"
python3 - "$work/faults.events" "$work/faults.sum" <<'PY' && ok "events and summary name every incident" || bad "events/summary"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
kinds = {}
for e in ev:
    for k in ("time", "kind", "rank", "device", "action", "lost_steps", "recovery_s"):
        assert k in e, f"event without {k}: {e}"
    kinds.setdefault(e["kind"], []).append(e)
want = {"crash": (2, "relaunch"), "hang": (1, "relaunch"), "commfail": (3, "relaunch"),
        "nan": (0, "redo"), "grad_outlier": (0, "redo"), "replica_mismatch": (3, "rollback")}
for kind, (rank, action) in want.items():
    assert kind in kinds, f"no {kind} event in {sorted(kinds)}"
    e = kinds[kind][0]
    assert e["rank"] == rank and e["device"] == str(rank), f"{kind}: rank {e['rank']} device {e['device']}"
    assert e["action"] == action, f"{kind}: action {e['action']}"
    assert e["recovery_s"] is not None and e["recovery_s"] >= 0, f"{kind}: recovery {e['recovery_s']}"
    print(f"{kind}: rank {e['rank']} {e['action']} lost {e['lost_steps']} recovery {e['recovery_s']} s")
assert len(kinds.get("inject", [])) == 6, "six injections logged"
s = json.load(open(sys.argv[2]))
for k in ("wall_s", "productive_s", "goodput", "restarts", "quarantined", "incidents",
          "recovery_median_s", "recovery_max_s"):
    assert k in s, f"summary without {k}"
assert s["restarts"] == 3, f"restarts {s['restarts']}"
assert s["quarantined"] == 0
assert 0 < s["goodput"] <= 1 and s["productive_s"] <= s["wall_s"]
for k in want:
    assert s["incidents"].get(k, 0) >= 1, f"summary incidents lack {k}"
print(f"goodput {s['goodput']:.3f}, restarts {s['restarts']}, recovery median {s['recovery_median_s']:.2f} s")
PY
grep -q "rk run: finished" "$work/faults.out" && ok "a human summary closes the run" || bad "no closing summary"

# --- quarantine and elastic shrink ----------------------------------------------------------
if sup quar --inject "crash@step=40:rank=2,crash@step=90:rank=2"; then ok "run with a failing device finishes"
else bad "quarantine run: exit $?: $(tail -8 "$work/quar.out")"; fi
[[ $(json "$work/quar.sum" quarantined 2>/dev/null) == 1 ]] && ok "device 2 quarantined" || bad "not quarantined"
[[ $(json "$work/quar.sum" final_ranks 2>/dev/null) == 3 ]] && ok "finished on 3 ranks" || bad "final ranks"
grep -q '"kind":"quarantine".*"device":"2"' "$work/quar.events" && ok "quarantine event names device 2" \
  || bad "no quarantine event for device 2"
acc=$(json "$work/quar.json" test_accuracy 2>/dev/null)
python3 -c "import sys; a, r = float(sys.argv[1]), float(sys.argv[2]); print(f'accuracy {a:.4f} vs fault-free {r:.4f}'); sys.exit(abs(a - r) > 0.005)" "$acc" "$ref_acc" \
  && ok "test accuracy within 0.5 points of the fault-free run" || bad "accuracy $acc vs $ref_acc"

# --- giving up: out of restarts, too few devices -------------------------------------------
"$RK" run -n 2 --ckpt-dir "$work/g1.ck" --quiet --max-restarts 0 --inject crash@step=20:rank=1 \
  -- "${worker[@]}" --max-steps 60 >"$work/g1.out" 2>&1
[[ $? == 1 ]] && grep -q "giving up: the job failed again after 0 relaunches (--max-restarts 0)" "$work/g1.out" \
  && ok "out of restarts: exit 1 with one clear line" || bad "max-restarts: $(grep 'rk run' "$work/g1.out" | tail -2)"
"$RK" run -n 2 --ckpt-dir "$work/g2.ck" --quiet --min-ranks 2 --failure-threshold 1 \
  --inject crash@step=20:rank=1 -- "${worker[@]}" --max-steps 60 >"$work/g2.out" 2>&1
[[ $? == 1 ]] && grep -q "giving up: 1 device left, below --min-ranks 2" "$work/g2.out" \
  && ok "below --min-ranks: exit 1 with one clear line" || bad "min-ranks: $(grep 'rk run' "$work/g2.out" | tail -2)"

# --- bad usage ------------------------------------------------------------------------------
"$RK" run -n 2 --inject "crash@step=1:rnk=2" -- true >"$work/u1.out" 2>&1
[[ $? == 2 ]] && grep -q "position 14" "$work/u1.out" && ok "bad fault spec: exit 2 with its position" \
  || bad "bad spec: $(cat "$work/u1.out" | head -2)"
"$RK" run -n 2 >"$work/u2.out" 2>&1
[[ $? == 2 ]] && grep -q "no worker command" "$work/u2.out" && ok "no worker: exit 2" || bad "no worker"
"$RK" run -- true >"$work/u3.out" 2>&1
[[ $? == 2 ]] && grep -q "\-n N is required" "$work/u3.out" && ok "no -n: exit 2" || bad "no -n"
"$RK" run -n 3 --devices 0,1 -- true >"$work/u4.out" 2>&1
[[ $? == 2 ]] && grep -q "lists 2 devices for -n 3" "$work/u4.out" && ok "too few devices: exit 2" || bad "devices"
"$RK" run -n 1 --ckpt-dir "$work/u5.ck" --quiet -- "$RK" train --bogus >"$work/u5.out" 2>&1
[[ $? == 2 ]] && grep -q "rejected its arguments" "$work/u5.out" && ok "worker usage error: exit 2, no relaunch" \
  || bad "worker usage: $(tail -2 "$work/u5.out")"

it_finish
