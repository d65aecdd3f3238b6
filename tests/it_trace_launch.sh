#!/usr/bin/env bash
# RK_TRACE_LAUNCH (docs/run.md, "Where a relaunch's time goes"): rk run, its keeper, the ranks'
# start-up and the worker runtimes append "PHASE T PID LAUNCH RANK" lines, and for one
# relaunch after a crash the phases come in the order the relaunch passes them (in the file
# and in T, one CLOCK_MONOTONIC for every process; order only, no durations checked):
# (1) rk train under mpirun (auto), 2 ranks, rank 1 crashes at step 20 (an injected SIGKILL):
#     sup.exited, sup.teardown, sup.torn, sup.verdict of launch 0 (sup.fail, where marked,
#     before the verdict: it races with the launcher's exit), then sup.start,
#     keeper.start, launcher.exec of launch 1, then in each rank's process of launch 1
#     rankenv.main, rankenv.exec, train.main, train.comm, train.data, train.model,
#     worker.resume, worker.resumed, worker.hello, worker.step, and sup.resumed after every
#     rank's hello and a rank's first step; skipped without mpirun;
# (2) a Python worker (rekindle.Worker) under --launcher local: keeper.start, rank.exec,
#     py.import, worker.hello, worker.step, sup.resumed;
# (3) without RK_TRACE_LAUNCH nothing is written; a relative path is refused by rk run
#     (exit 2, nothing made).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_trace_launch
unset MASTER_ADDR MASTER_PORT
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none

# check TRACE SPEC: the order checker; SPEC names the phases of launch 1's ranks
check() {
  it_count python3 - "$1" "$2" <<'PY'
import sys
path, spec = sys.argv[1], sys.argv[2]
lines = []
bad = 0
for i, l in enumerate(open(path)):
    p = l.split()
    try:
        lines.append((i, p[0], float(p[1]), int(p[2]), int(p[3]), int(p[4])))
    except (IndexError, ValueError):
        bad += 1
    if len(p) != 5:
        bad += 1
def check(cond, what):
    print(("ok - " if cond else "FAIL - ") + what)
check(bad == 0 and lines, f"every line is PHASE T PID LAUNCH RANK ({len(lines)} lines, {bad} bad)")
def one(phase, launch):
    got = [x for x in lines if x[1] == phase and x[4] == launch]
    return got[0] if got else None
def before(a, b):  # a line before b, in the file and in time
    return a is not None and b is not None and a[0] < b[0] and a[2] <= b[2]
sup = ["sup.exited/0", "sup.teardown/0", "sup.torn/0", "sup.verdict/0", "sup.start/1",
       "keeper.start/1"] + (["launcher.exec/1"] if "rankenv" in spec else [])
got = [one(s.split("/")[0], int(s.split("/")[1])) for s in sup]
missing = [s for s, g in zip(sup, got) if g is None]
check(not missing, f"rk run and the keeper mark {', '.join(sup)} (missing: {missing})")
check(not missing and all(before(a, b) for a, b in zip(got, got[1:])),
      "... in that order: the launcher's exit, the teardown, the verdict, the next launch")
# sup.fail and the launcher's exit race (mpirun may end the job before rk run reads the rank's
# death from its heartbeat socket; the verdict then judges the launcher's exit and no failure
# is marked): when marked, before the verdict
fail = one("sup.fail", 0)
check(fail is None or before(fail, got[3]), "sup.fail of launch 0, where marked, before the verdict")
phases = spec.split(",")
pids = sorted({x[3] for x in lines if x[4] == 1 and x[1] == phases[-1]})
check(len(pids) == 2, f"two rank processes of launch 1 said their first step: pids {pids}")
keeper = one("keeper.start", 1)
resumed = one("sup.resumed", 1)
for pid in pids:
    mine = [x for x in lines if x[4] == 1 and x[3] == pid and x[1] in phases]
    names = [x[1] for x in mine]
    check(names == phases, f"pid {pid} of launch 1: {' '.join(names)}")
    check(all(before(a, b) for a, b in zip(mine, mine[1:])), f"pid {pid}: in the file's and T's order")
    check(before(keeper, mine[0]), f"pid {pid}: after keeper.start of launch 1")
    hello = [x for x in mine if x[1] == "worker.hello"]
    check(hello and before(hello[0], resumed), f"pid {pid}: its hello before sup.resumed of launch 1")
    check(len({x[5] for x in mine if x[1] != "rankenv.main"}) == 1 and mine[-1][5] in (0, 1),
          f"pid {pid}: one RANK ({mine[-1][5]}) on its lines")
first = min((x for x in lines if x[4] == 1 and x[1] == "worker.step"), key=lambda x: x[0], default=None)
check(before(first, resumed), "sup.resumed after a rank's first step of launch 1")
PY
}

# --- (1) rk train under mpirun ---------------------------------------------------------------
if command -v mpirun >/dev/null; then
  it_need_data
  RK_TRACE_LAUNCH="$work/t1" timeout 300 "$RK" run -n 2 --ckpt-dir "$work/ck1" --quiet \
    --events "$work/e1" --inject crash@step=20:rank=1 -- "$RK" train --model mlp --epochs 1 \
    --no-eval --threads 1 --seed 1 --max-steps 40 --ckpt-every 10 >"$work/o1" 2>&1
  st=$?
  [[ $st == 0 ]] && ok "rk train: crash, relaunch, finished (exit 0)" || bad "rk train: exit $st: $(tail -3 "$work/o1")"
  check "$work/t1" rankenv.main,rankenv.exec,train.main,train.comm,train.data,train.model,worker.resume,worker.resumed,worker.hello,worker.step
else
  echo "skip - mpirun not found: rk train's phases not traced"
fi

# --- (2) a Python worker under --launcher local ----------------------------------------------
cat >"$work/w.py" <<'PY'
import os, rekindle
w = rekindle.Worker()
w.hello(0)
for step in range(1, 6):
    w.step(step, 0.5, 0.01)
    if step == 3 and w.launch == 0 and w.rank == 1:
        os.kill(os.getpid(), 9)  # a crash, after rank 0's steps are seen
    w.poll()
w.bye(5, "done")
PY
RK_TRACE_LAUNCH="$work/t2" timeout 120 "$RK" run -n 2 --quiet --events "$work/e2" -- python3 "$work/w.py" \
  >"$work/o2" 2>&1
st=$?
[[ $st == 0 ]] && ok "Python worker: crash, relaunch, finished (exit 0)" || bad "Python worker: exit $st: $(tail -3 "$work/o2")"
check "$work/t2" rank.exec,py.import,worker.hello,worker.step

# --- (3) off without the variable; a relative path refused -----------------------------------
(cd "$work" && timeout 120 "$RK" run -n 1 --quiet -- python3 "$work/w.py" >"$work/o3" 2>&1)
st=$?
left=$(find "$work" -newer "$work/o2" -type f ! -name o3 | wc -l)
[[ $st == 0 && $left == 0 ]] && ok "without RK_TRACE_LAUNCH: nothing written" || bad "exit $st, $left new files"
(cd "$work" && RK_TRACE_LAUNCH=rel.trace timeout 60 "$RK" run -n 1 --quiet -- python3 "$work/w.py" >"$work/o4" 2>&1)
st=$?
[[ $st == 2 && ! -e $work/rel.trace ]] && grep -q "RK_TRACE_LAUNCH" "$work/o4" \
  && ok "a relative RK_TRACE_LAUNCH: exit 2, named, nothing made" || bad "exit $st: $(cat "$work/o4")"

it_finish
