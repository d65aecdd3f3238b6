#!/usr/bin/env bash
# rk run supervising a worker that is not rekindle's: examples/python_worker.py (Python
# standard library only) speaks the heartbeat protocol and checkpoints on its own. The test
# kills it with SIGKILL (a real signal, by its pid) after its first checkpoints; rk run sees
# the crash, relaunches it with RK_RESUME=1, and the run ends with bitwise the same w and b as
# an uninterrupted run. Also: the supervisor's stop command (on SIGINT to rk run) makes the
# worker checkpoint and exit 4, and rk run exits 130; with 2 ranks under mpirun and one a
# straggler, no rank exits before every rank's stop checkpoint is written. Skips (77) without
# mpirun or python3.
set -u
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_pyworker
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
py=(python3 "$RK_SRC/examples/python_worker.py" --steps 150 --sleep 0.02 --ckpt-every 10)

"${py[@]}" --result "$work/ref.json" >"$work/ref.out" 2>&1 || { bad "standalone run"; it_finish; exit; }
ok "standalone python worker runs"

ckpt_step() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['step'])" "$work/ck/python_worker.rank0.json" 2>/dev/null || echo 0; }

"$RK" run -n 1 --ckpt-dir "$work/ck" --heartbeat-timeout 5 --events "$work/ev" \
  --summary-json "$work/sum" --quiet -- "${py[@]}" --pid-file "$work/pid" --result "$work/out.json" \
  >"$work/run.out" 2>&1 &
sup=$!
pids+=("$sup")
if wait_for '[[ $(ckpt_step) -ge 40 ]]' 30; then
  victim=$(cat "$work/pid")
  kill -9 "$victim" && ok "killed the worker (pid $victim) after its checkpoint of step $(ckpt_step)"
else
  bad "no checkpoint of step 40 within 30 s"
fi
wait "$sup"; st=$?
[[ $st == 0 ]] && ok "rk run finished the job (exit 0)" || bad "rk run exit $st: $(tail -5 "$work/run.out")"
python3 - "$work/ref.json" "$work/out.json" <<'PY' && ok "w and b equal the uninterrupted run's, bit for bit" || bad "results differ"
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print(f"uninterrupted step {a['step']} w {a['w']!r} b {a['b']!r}; supervised w {b['w']!r} b {b['b']!r}")
assert a["step"] == b["step"] == 150 and a["w"] == b["w"] and a["b"] == b["b"]
PY
python3 - "$work/ev" "$work/sum" <<'PY' && ok "the crash is in the events and the summary" || bad "events/summary"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
crash = [e for e in ev if e["kind"] == "crash"]
assert len(crash) == 1 and crash[0]["action"] == "relaunch" and crash[0]["recovery_s"] is not None, ev
s = json.load(open(sys.argv[2]))
assert s["restarts"] == 1 and s["incidents"] == {"crash": 1} and s["steps"] == 150, s
print(f"crash: lost {crash[0]['lost_steps']} steps, recovered in {crash[0]['recovery_s']} s")
PY

# SIGINT to rk run: the worker is told to stop, checkpoints, exits 4; rk run exits 130
rm -rf "$work/ck2"
"$RK" run -n 1 --ckpt-dir "$work/ck2" --quiet -- "${py[@]}" --steps 100000 >"$work/int.out" 2>&1 &
sup=$!
pids+=("$sup")
wait_for '[[ -e $work/ck2/python_worker.rank0.json ]]' 30
kill -INT "$sup"
wait "$sup"; st=$?
[[ $st == 130 ]] && ok "interrupted rk run exits 130" || bad "interrupt: exit $st: $(tail -3 "$work/int.out")"
grep -q "interrupted" "$work/int.out" && ok "it says it was interrupted" || bad "no interrupt message"

# 2 ranks under mpirun, rank 1 a straggler (0.4 s a step): SIGINT to rk run. Every rank
# checkpoints the step it stopped at before any exits 4; a rank that left at once would make
# mpirun kill rank 1 before its stop checkpoint
rm -rf "$work/ck3"
"$RK" run -n 2 --launcher mpirun --ckpt-dir "$work/ck3" --quiet -- "${py[@]}" --steps 100000 \
  --sleep 0.01,0.4 --ckpt-every 2 >"$work/int2.out" 2>&1 &
sup=$!
pids+=("$sup")
wait_for '[[ -e $work/ck3/python_worker.rank1.json ]]' 30 || bad "2 ranks: no checkpoint of rank 1 in 30 s"
kill -INT "$sup"
wait "$sup"; st=$?
[[ $st == 130 ]] && ok "2 ranks: interrupted rk run exits 130" || bad "2 ranks: exit $st: $(tail -3 "$work/int2.out")"
python3 - "$work/int2.out" "$work/ck3" <<'PY' && ok "2 ranks: each rank's checkpoint is of the step it stopped at" || bad "2 ranks: a stop checkpoint is missing: $(grep -i stop "$work/int2.out" | head -4)"
import json, re, sys
out = open(sys.argv[1], errors="replace").read()
stops = {int(r): int(s) for r, s in re.findall(r"rank (\d+): stopped at step (\d+)", out)}
ck = {r: json.load(open(f"{sys.argv[2]}/python_worker.rank{r}.json"))["step"] for r in (0, 1)}
print(f"stopped at {stops}, checkpoints at {ck}")
assert sorted(stops) == [0, 1] and all(ck[r] == stops[r] for r in (0, 1)), (stops, ck)
PY
it_finish
