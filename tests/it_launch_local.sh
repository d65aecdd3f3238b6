#!/usr/bin/env bash
# rk run's own launcher and the ranks' environment (docs/run.md, "How it launches", "The
# ranks' environment", "Stacks of a hung rank"), with real processes of tests/launch_worker.py
# (standard Python, rank and world from RANK and WORLD_SIZE alone):
# (1) --launcher local, 2 ranks: distinct RANK and LOCAL_RANK, WORLD_SIZE 2, MASTER_ADDR,
#     CUDA_DEVICE_ORDER, TORCHELASTIC_RESTART_COUNT = RK_LAUNCH, CUDA_VISIBLE_DEVICES = the
#     --devices of the launch; a SIGKILL of rank 1 ends rank 0 at once (the keeper reports
#     rank 1's status 137) and the job is relaunched with a fresh MASTER_PORT; the same crash
#     on the same device again quarantines it, and the next launch's CUDA_VISIBLE_DEVICES
#     lacks it;
# (2) a hang is found by heartbeats, the hung rank's Python stack (the function it hangs in)
#     is in rk run's log before the teardown, and the hang event names the dump;
# (3) auto: mpirun for rk train (it needs libmpi.so), local for python3; an unexecutable worker
#     under local is one message and exit 2;
# (4) under mpirun the ranks see RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE too, from
#     rk _rank-env, which keeps the pid (the hello check holds), and a worker it cannot run
#     stops the job with exit 2; skipped without mpirun;
# (5) PYTHONPATH starts with the source tree's python/ when it holds the rekindle package,
#     and --no-pythonpath leaves it as given; skipped while python/rekindle/ is absent.
# Skips (77) without python3.
set -u
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_launch_local
w=(python3 "$RK_SRC/tests/launch_worker.py")

# --- (1) the environment, a crash, a quarantine ----------------------------------------------
mkdir -p "$work/l1"
timeout 120 "$RK" run -n 2 --launcher local --devices 4,2,7 --failure-threshold 2 --health off \
  --quiet --events "$work/l1.ev" --summary-json "$work/l1.sum" -- "${w[@]}" --log "$work/l1" \
  --steps-first 100000 --steps 30 --rank 1 --launches 0,1 --crash-at 5 >"$work/l1.out" 2>&1
st=$?
[[ $st == 0 ]] && ok "two crashes, a quarantine, then the job finishes (exit 0)" \
  || bad "exit $st: $(grep 'rk run' "$work/l1.out" | tail -4)"
grep -q "launcher local (--launcher)" "$work/l1.out" && ok "the first line says the launcher" \
  || bad "no launcher line: $(head -2 "$work/l1.out")"
it_count python3 - "$work/l1" "$work/l1.ev" <<'PY'
import json, sys
d, evf = sys.argv[1], sys.argv[2]
def env(launch, rank):
    return json.load(open(f"{d}/env.{launch}.{rank}.json"))
def check(cond, what):
    print(("ok - " if cond else "FAIL - ") + what)
e0, e1 = env(0, 0), env(0, 1)
check((e0["RANK"], e1["RANK"], e0["LOCAL_RANK"], e1["LOCAL_RANK"]) == ("0", "1", "0", "1"),
      f"RANK and LOCAL_RANK 0 and 1: {e0['RANK']},{e1['RANK']} {e0['LOCAL_RANK']},{e1['LOCAL_RANK']}")
check(all(e[k] == "2" for e in (e0, e1) for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE")),
      "WORLD_SIZE and LOCAL_WORLD_SIZE 2")
check(all(e["MASTER_ADDR"] == "127.0.0.1" and e["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
          for e in (e0, e1)), "MASTER_ADDR 127.0.0.1, CUDA_DEVICE_ORDER PCI_BUS_ID")
check(e0["MASTER_PORT"] == e1["MASTER_PORT"] and 0 < int(e0["MASTER_PORT"]) < 65536,
      f"one MASTER_PORT for the launch's ranks: {e0['MASTER_PORT']}")
ports = [env(l, 0)["MASTER_PORT"] for l in (0, 1, 2)]
check(len(set(ports)) == 3, f"a fresh MASTER_PORT for every launch: {ports}")
cvd = [env(l, 0)["CUDA_VISIBLE_DEVICES"] for l in (0, 1, 2)]
check(cvd == ["4,2", "4,2", "4,7"], f"CUDA_VISIBLE_DEVICES follows --devices and the quarantine: {cvd}")
check(all(env(l, r)["CUDA_VISIBLE_DEVICES"] == env(l, r)["RK_DEVICES"] for l in (0, 1, 2)
          for r in (0, 1)), "CUDA_VISIBLE_DEVICES = RK_DEVICES")
check([env(l, 1)["TORCHELASTIC_RESTART_COUNT"] for l in (0, 1, 2)] == ["0", "1", "2"],
      "TORCHELASTIC_RESTART_COUNT = RK_LAUNCH")
ev = [json.loads(l) for l in open(evf)]
crash = [e for e in ev if e["kind"] == "crash"]
check(len(crash) == 2 and all(e["rank"] == 1 and e["device"] == "2" for e in crash),
      f"two crashes of rank 1 on device 2: {[(e['rank'], e['device']) for e in crash]}")
check(all("launcher exit status 137" in e["detail"] for e in crash),
      "the keeper ended rank 0 and exited with rank 1's status (137)")
check(all(e["recovery_s"] is not None and e["recovery_s"] < 5 for e in crash),
      f"each crash recovered within seconds: {[e['recovery_s'] for e in crash]} s")
q = [e for e in ev if e["kind"] == "quarantine"]
check(len(q) == 1 and q[0]["device"] == "2", f"device 2 quarantined: {q}")
PY

# --- (2) a hang, and the hung rank's stack ----------------------------------------------------
mkdir -p "$work/hang"
timeout 120 "$RK" run -n 2 --launcher local --heartbeat-timeout 2 --health off --quiet \
  --events "$work/hang/events.jsonl" -- "${w[@]}" --hang-at 8 --steps 30 >"$work/hang.out" 2>&1
st=$?
[[ $st == 0 ]] && ok "the hang is found and the relaunch finishes (exit 0)" \
  || bad "hang: exit $st: $(grep 'rk run' "$work/hang.out" | tail -4)"
it_count python3 - "$work/hang.out" "$work/hang/events.jsonl" "$work/hang" <<'PY'
import json, os, sys
out, evf, d = open(sys.argv[1]).read().splitlines(), sys.argv[2], sys.argv[3]
def check(cond, what):
    print(("ok - " if cond else "FAIL - ") + what)
fn = [i for i, l in enumerate(out) if "rank 1 |" in l and "in hung_in_compute_for_test" in l]
hang = [i for i, l in enumerate(out) if "] hang: rank 1" in l]
check(bool(fn) and bool(hang) and fn[0] < hang[0],
      "the hung rank's function is in rk run's log before the hang is handled: "
      + (out[fn[0]].strip() if fn else "none"))
ev = [json.loads(l) for l in open(evf)]
h = [e for e in ev if e["kind"] == "hang"]
want = os.path.join(os.path.realpath(d), "stacks-rank1-launch0.txt")
check(len(h) == 1 and h[0]["rank"] == 1 and h[0].get("stacks") == [want] and want in h[0]["detail"],
      f"the hang event names the dump: {h[0].get('stacks') if h else None}")
check(os.path.isfile(want) and "hung_in_compute_for_test" in open(want).read(),
      "the dump is in the --events directory")
check(not any("rank 0 |" in l for l in out), "only the hung rank was asked for its stacks")
PY

# --- (3) auto, and a worker that cannot be executed -------------------------------------------
timeout 60 "$RK" run -n 1 --health off --quiet --max-restarts 0 -- "$RK" train --bogus \
  >"$work/auto1.out" 2>&1
grep -q "launcher mpirun (.* needs libmpi.so" "$work/auto1.out" && ok "auto: mpirun for rk train" \
  || bad "auto for rk train: $(head -1 "$work/auto1.out")"
timeout 60 "$RK" run -n 1 --health off --quiet -- "${w[@]}" --steps 3 >"$work/auto2.out" 2>&1
st=$?
[[ $st == 0 ]] && grep -q "launcher local (python3 .* is not an MPI program)" "$work/auto2.out" \
  && ok "auto: local for python3 (exit $st)" || bad "auto for python3: exit $st: $(head -1 "$work/auto2.out")"
timeout 60 "$RK" run -n 2 --launcher local --health off --quiet -- "$work/no-such-worker" \
  >"$work/noexec.out" 2>&1
st=$?
[[ $st == 2 && $(grep -c "cannot run the worker $work/no-such-worker: No such file or directory" "$work/noexec.out") == 1 ]] \
  && ! grep -q relaunch "$work/noexec.out" && ok "an unexecutable worker: one message, exit 2" \
  || bad "unexecutable worker: exit $st: $(cat "$work/noexec.out")"
"$RK" --help | grep -q "_rank-env" && bad "rk --help lists the hidden _rank-env" \
  || ok "rk --help does not list _rank-env"

# --- (4) under mpirun -------------------------------------------------------------------------
if command -v mpirun >/dev/null; then
  export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
  mkdir -p "$work/mpi"
  timeout 120 "$RK" run -n 2 --launcher mpirun --devices 3,1 --health off --quiet -- "${w[@]}" \
    --log "$work/mpi" --steps 5 >"$work/mpi.out" 2>&1
  st=$?
  [[ $st == 0 ]] && ok "2 ranks under mpirun finish (every hello's pid checked)" \
    || bad "mpirun: exit $st: $(grep 'rk run' "$work/mpi.out" | tail -3)"
  it_count python3 - "$work/mpi" <<'PY'
import json, sys
e = [json.load(open(f"{sys.argv[1]}/env.0.{r}.json")) for r in (0, 1)]
ok = all(x["RANK"] == x["OMPI_COMM_WORLD_RANK"] == str(r) and x["LOCAL_RANK"] == str(r)
         and x["WORLD_SIZE"] == x["LOCAL_WORLD_SIZE"] == "2" and x["CUDA_VISIBLE_DEVICES"] == "3,1"
         and x["MASTER_PORT"] == e[0]["MASTER_PORT"] for r, x in enumerate(e))
print(("ok - " if ok else "FAIL - ") + "under mpirun each rank sees its RANK, LOCAL_RANK, WORLD_SIZE, "
      f"CUDA_VISIBLE_DEVICES: {[(x.get('RANK'), x.get('LOCAL_RANK'), x.get('WORLD_SIZE')) for x in e]}")
PY
  timeout 60 "$RK" run -n 2 --launcher mpirun --health off --quiet -- "$work/no-such-worker" \
    >"$work/mpinoexec.out" 2>&1
  st=$?
  # (the wrapper's line itself may be lost: mpirun does not always forward a rank's last
  # output when it ends the job at once)
  [[ $st == 2 ]] && grep -q "incidents: usage 1" "$work/mpinoexec.out" \
    && ! grep -q "] relaunch " "$work/mpinoexec.out" \
    && ok "under mpirun an unexecutable worker is named and stops the job (exit 2)" \
    || bad "mpirun, unexecutable worker: exit $st: $(cat "$work/mpinoexec.out")"
else
  echo "skip - mpirun not found: the environment under mpirun not tested"
fi

# --- (5) PYTHONPATH -------------------------------------------------------------------------
if [[ -f "$RK_SRC/python/rekindle/__init__.py" ]]; then
  mkdir -p "$work/pp1" "$work/pp2"
  PYTHONPATH=/given timeout 60 "$RK" run -n 1 --health off --quiet -- "${w[@]}" --steps 2 \
    --log "$work/pp1" >"$work/pp1.out" 2>&1
  PYTHONPATH=/given timeout 60 "$RK" run -n 1 --health off --quiet --no-pythonpath -- "${w[@]}" \
    --steps 2 --log "$work/pp2" >"$work/pp2.out" 2>&1
  [[ $(json "$work/pp1/env.0.0.json" PYTHONPATH) == "$RK_SRC/python:/given" ]] \
    && ok "PYTHONPATH starts with the source tree's python/" \
    || bad "PYTHONPATH: $(json "$work/pp1/env.0.0.json" PYTHONPATH)"
  [[ $(json "$work/pp2/env.0.0.json" PYTHONPATH) == "/given" ]] \
    && ok "--no-pythonpath leaves PYTHONPATH as given" \
    || bad "--no-pythonpath: $(json "$work/pp2/env.0.0.json" PYTHONPATH)"
else
  echo "skip - $RK_SRC/python/rekindle is not in this tree: PYTHONPATH not tested"
fi
it_finish
