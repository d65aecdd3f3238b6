#!/usr/bin/env bash
# rk run with a simulated fleet whose GPUs fail, and the failure predictor in the health gate:
#  - a simulated GPU that falls off the bus during the job kills the rank using it (by pid,
#    said as simulated); the crash is handled like any other and the relaunch leaves the
#    gone GPU out, even with the score gate off (threshold 0); the job finishes;
#  - --predictor with a model that predicts failure everywhere drains the running job's GPU
#    (event predicted_failure, checkpoint, stop, relaunch without it) and leaves it out;
#  - one that predicts none changes nothing;
#  - bad flags: --predictor without the gate, --sim-skip without the simulator, a missing
#    model file, a broken MODEL.json beside it: exit 2.
# Fleet: seed 6 of 8 GPUs; its first failure is read from the simulator's ground truth and
# --sim-skip puts it 3 simulated minutes (30 steps) into the job. The fleet runs as the dataset builder
# runs it (busy, sensors fitted: --sim-load busy --sim-sensors), so that its ground truth is
# this fleet's. Skips (77) without mpirun or data.
set -u
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_need_data
it_init it_drain
MK=${RK_MKMODEL:?}
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
python3 "$RK_SRC/tests/make_subset.py" "$DATA" "$work/sub" 2000 200 || { bad "make subset"; exit 1; }
sim=(--sim-load busy --sim-sensors)
worker=("$RK" train --model cnn-small --data "$work/sub" --epochs 50 --no-eval --threads 1 --ckpt-every 20)

# 1. the failure reaches the rank. The fleet's ground truth (rk predict dataset, the same
# simulator) says which GPU fails first and when; the job starts 3 simulated minutes before
# and the fleet ages 6 s a step (--sim-step-time), so the GPU fails at the job's 30th step
# however fast the machine is; a GPU that is already gone when the ranks say hello is
# delivered then.
"$RK" predict dataset --sim 8 --hours 3000 --seed 6 --age 0 -o "$work/fleet" >/dev/null 2>&1 ||
  { bad "rk predict dataset"; it_finish; exit 1; }
read -r g ev hour < <(python3 - "$work/fleet/fleet.json" <<'PY'
import json, sys
f = json.load(open(sys.argv[1]))
lost = [(d["start_minute"] + d["failure"]["minute"] + 1, d["index"], d["failure"]["event"])
        for d in f["devices"] if d["failure"] and d["failure"]["event"] in ("off_bus", "thermal_shutdown", "dbe")]
m, i, e = min(lost) if lost else (0, -1, "-")
print(i, e, m / 60.0)
PY
)
if [[ $g -lt 0 ]]; then bad "no failure in the fleet's first 3000 h"; it_finish; exit 1; fi
skip=$(python3 -c "print(max(0.0, $hour - 0.05))")
others=$(python3 -c "print(','.join(str(d) for d in range(8) if d != $g)[:3])")
"$RK" run -n 2 --devices "$g,$others,7" --health sim --sim-seed 6 "${sim[@]}" --sim-skip "$skip" \
  --sim-step-time 6s --health-interval 0.5 --health-threshold 0 --ckpt-dir "$work/ck1" \
  --events "$work/ev1.jsonl" --quiet -- "${worker[@]}" --max-steps 500 >"$work/r1.out" 2>&1
st=$?
if [[ $ev == dbe ]]; then want="uncorrectable ECC error"; else want="off the bus"; fi
if [[ $st -eq 0 ]] && grep -q "simulated GPU $g failed ($want): killing rank 0" "$work/r1.out" &&
   grep -q '"kind":"crash"' "$work/ev1.jsonl"; then
  ok "GPU $g's $ev (simulated, at $hour h) kills its rank; relaunched, finished ($(grep -m1 'finished' "$work/r1.out" | sed 's/rk run: //'))"
else
  bad "failure delivery ($ev of GPU $g at $hour h, skip $skip): exit $st: $(grep 'rk run' "$work/r1.out" | tail -5)"
fi
if [[ $ev != dbe ]]; then
  grep -q "device $g left out of this launch: the GPU is gone (simulated)" "$work/r1.out" &&
    ok "the gone GPU is left out of the relaunch, with the score gate off" ||
    bad "gone GPU not left out: $(grep 'rk run' "$work/r1.out" | tail -4)"
fi

# 2. a model that predicts failure everywhere: the running job's GPU is drained
"$MK" "$work/hot.model" 5 8 8 >/dev/null && "$MK" "$work/cold.model" 5 8 -8 >/dev/null ||
  { bad "mkmodel"; it_finish; exit 1; }
# (no skip: the windows fill 5 simulated minutes, 50 steps, into the run: the job starts first)
"$RK" run -n 1 --devices 3,4 --health sim --sim-seed 6 "${sim[@]}" --sim-step-time 6s --health-interval 0.5 \
  --health-threshold 0 --predictor "$work/hot.model" \
  --min-ranks 1 --ckpt-dir "$work/ck2" --events "$work/ev2.jsonl" --quiet -- "${worker[@]}" \
  --max-steps 300 >"$work/r2.out" 2>&1
st=$?
if grep -q '"kind":"predicted_failure","rank":0,"device":"3","action":"drain"' "$work/ev2.jsonl" &&
   grep -Eq "draining device 3 \(rank 0\): predicted to fail \(p=(0\.9|1\.0)" "$work/r2.out" &&
   grep -q "device 4 left out of this launch: predicted to fail" "$work/r2.out"; then
  ok "--predictor: a GPU predicted to fail is drained or left out (exit $st: $(grep -m1 'predicted to fail' "$work/r2.out" | sed 's/rk run: \[[^]]*\] //'))"
else
  bad "predicted drain: exit $st: $(grep 'rk run' "$work/r2.out" | tail -5)"
fi
"$RK" run -n 1 --devices 3 --health sim --sim-seed 6 "${sim[@]}" --sim-step-time 6s --health-interval 0.5 \
  --health-threshold 0 --predictor "$work/cold.model" \
  --ckpt-dir "$work/ck3" --events "$work/ev3.jsonl" --quiet -- "${worker[@]}" --max-steps 60 \
  >"$work/r3.out" 2>&1
st=$?
if [[ $st -eq 0 ]] && ! grep -q predicted_failure "$work/ev3.jsonl" 2>/dev/null; then
  ok "--predictor with a model that predicts no failure: the job runs through"
else bad "cold model: exit $st: $(tail -3 "$work/r3.out")"; fi

# 3. usage
expect2() {
  local what=$1; shift
  "$RK" run -n 1 "$@" -- "${worker[@]}" >"$work/bad.out" 2>&1
  local st=$?
  if [[ $st -eq 2 ]] && grep -q -- "$what" "$work/bad.out"; then ok "refused: $(head -1 "$work/bad.out")"
  else bad "$* -> exit $st: $(head -2 "$work/bad.out")"; fi
}
expect2 "needs the health gate" --health off --predictor "$work/hot.model"
expect2 "needs the health gate" --predictor "$work/hot.model"
expect2 "needs --health sim" --health nvml --sim-skip 3
expect2 "--sim-load and --sim-sensors need --health sim" --health nvml --sim-load busy
expect2 "--sim-load 'hot' is not idle or busy" --health sim --sim-load hot
expect2 "no-such.model" --health sim --predictor "$work/no-such.model"
# the drain threshold's default comes from MODEL.json beside the model: a broken one is refused
cp "$work/hot.model" "$work/broken.model" && echo '{"format": "x"}' >"$work/broken.model.json"
expect2 "broken.model.json: not the detectors file" --health sim --predictor "$work/broken.model"
it_finish
