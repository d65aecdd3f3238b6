#!/usr/bin/env bash
# The health gate of rk run on a simulated fleet (device ids are its GPU indices): a GPU
# that already scores below the threshold is left out of the first launch and a spare takes
# its place; a GPU that degrades during the run is drained (checkpoint, stop, relaunch
# without it) and the job finishes. The fleet ages with the job's steps, not with the wall
# clock (--sim-step-time): seed 40 from 8,000 hours of service at half an hour a step runs
# GPU 3 hot at step 184 of the 600, on a quiet machine and a loaded one alike (it once aged
# with the wall clock, and a quiet machine finished the job before any drain). The GPUs run
# busy (--sim-load busy: they are in a job) with the VRM and fan sensors fitted
# (--sim-sensors): their wear shows. Also: a device id that is no GPU index is refused, and
# the two clocks cannot be given together. Skips (77) without mpirun or data.
set -u
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_need_data
it_init it_gate
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
python3 "$RK_SRC/tests/make_subset.py" "$DATA" "$work/sub" 6400 500 || { bad "make subset"; exit 1; }
worker=("$RK" train --data "$work/sub" --threads 1 --no-eval --epochs 20 --max-steps 600
        --ckpt-every 25 --ckpt-async)

sim=(--sim-load busy --sim-sensors)
"$RK" run -n 4 --devices 0,1,2,3,4 --ckpt-dir "$work/ck" --health sim --sim-seed 40 "${sim[@]}" \
  --sim-age 8000 --sim-step-time 30m --health-interval 1 --events "$work/ev" \
  --summary-json "$work/sum" --quiet -- "${worker[@]}" >"$work/out" 2>&1
st=$?
[[ $st == 0 ]] && ok "the job finishes (exit 0)" || bad "exit $st: $(grep 'rk run' "$work/out" | tail -3)"
grep -q "health gate: sim GPUs (simulated)" "$work/out" && ok "the gate says its GPUs are simulated" \
  || bad "no simulated notice"
python3 - "$work/ev" "$work/out" <<'PY' && ok "a degrading GPU is drained and left out of the relaunch" || bad "drain: $(grep 'health\|relaunch' "$work/out" | head -5)"
import json, re, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
drains = [e for e in ev if e["kind"] == "health_drain"]
assert drains, f"no drain in {[e['kind'] for e in ev]}"
assert len(drains) == 1, f"{len(drains)} drains: {drains}"
d = drains[0]["device"]
assert d == "3", f"device {d} drained, not 3 (the step clock runs GPU 3 hot at step 184)"
step = int(re.search(r"at step (\d+)", drains[0]["detail"]).group(1))
assert 184 <= step < 600, f"drained at step {step}, before GPU 3 ran hot at 184"

print(f"device {d} drained: {drains[0]['detail']}")
out = open(sys.argv[2]).read()
relaunch = re.findall(r"relaunch \d+ on \d+ ranks? \(devices ([0-9,]+)\)", out)
assert relaunch, "no relaunch"
assert d not in relaunch[0].split(","), f"drained device {d} in the relaunch {relaunch[0]}"
print(f"relaunched on devices {relaunch[0]}")
PY

# the same fleet under a job three times slower (rank 0 sleeps 30 ms a step, the others wait
# for it at every step): the same story, GPU 3 alone drained once it has run hot at step 184
# (on the wall clock, the slow job aged the fleet three times as much a step and drained more)
"$RK" run -n 4 --devices 0,1,2,3,4 --ckpt-dir "$work/cks" --health sim --sim-seed 40 "${sim[@]}" \
  --sim-age 8000 --sim-step-time 30m --health-interval 1 --events "$work/evs" \
  --inject 'slow@step=0:rank=0:ms=30' --quiet -- "${worker[@]/600/300}" >"$work/outs" 2>&1
st=$?
python3 - "$work/evs" <<'PY' && ok "a job three times slower tells the same story (exit $st)" || bad "slow job: exit $st: $(grep 'health\|relaunch' "$work/outs" | head -5)"
import json, re, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
drains = [(e["device"], int(re.search(r"at step (\d+)", e["detail"]).group(1)))
          for e in ev if e["kind"] == "health_drain"]
assert [d for d, _ in drains] == ["3"] and drains[0][1] >= 184, f"drains {drains}"
print(f"device 3 drained at step {drains[0][1]} of the slow job")
PY

# from 12,000 hours GPU 3 is already below the threshold: left out, the spare 4 runs instead
# (a simulated second a step: the 20 steps change nothing else)
"$RK" run -n 4 --devices 0,1,2,3,4 --ckpt-dir "$work/ck2" --health sim --sim-seed 4 "${sim[@]}" \
  --sim-age 12000 --sim-step-time 1s --events "$work/ev2" --quiet \
  -- "$RK" train --data "$work/sub" --threads 1 --no-eval --max-steps 20 >"$work/out2" 2>&1
st=$?
[[ $st == 0 ]] && grep -q "4 ranks on devices 0,1,2,4;" "$work/out2" && \
  grep -q '"kind":"health_gate","rank":null,"device":"3","action":"left_out"' "$work/ev2" \
  && ok "a GPU below the threshold is left out of the first launch; the spare runs" \
  || bad "left out: exit $st: $(grep 'rk run' "$work/out2" | head -4)"

"$RK" run -n 2 --devices 0,gpu-a --health sim --quiet -- true >"$work/bad" 2>&1
[[ $? == 2 ]] && grep -q "device 'gpu-a' is not a GPU index 0..1023" "$work/bad" \
  && ok "a device id that is no GPU index is refused (exit 2)" || bad "bad device: $(cat "$work/bad")"

"$RK" run -n 1 --health sim --sim-step-time 1m --sim-time-scale 60 --quiet -- true >"$work/bad2" 2>&1
[[ $? == 2 ]] && grep -q "two clocks: give one" "$work/bad2" \
  && ok "--sim-step-time with --sim-time-scale is refused (exit 2)" || bad "two clocks: $(cat "$work/bad2")"
"$RK" run -n 1 --health nvml --sim-step-time 1m --quiet -- true >"$work/bad3" 2>&1
[[ $? == 2 ]] && grep -q "sim-step-time needs --health sim" "$work/bad3" \
  && ok "--sim-step-time without --health sim is refused (exit 2)" || bad "step clock, no sim: $(cat "$work/bad3")"
it_finish
