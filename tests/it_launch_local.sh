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
# (1b) a rank that stopped (exit 4) waits for the others: after SIGTERM to rk run, rank 0
#     stops at once and rank 1 a second later, and both reach their own stop (exit 130);
# (2) a hang is found by heartbeats, the hung rank's Python stack (the function it hangs in)
#     is in rk run's log before the teardown, and the hang event names the dump;
# (3) auto: mpirun for rk train (it needs libmpi.so), local for python3; an unexecutable worker
#     under local is one message and exit 2;
# (4) under mpirun the ranks see RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE too, from
#     rk _rank-env, which keeps the pid (the hello check holds), and a worker it cannot run
#     stops the job with exit 2; skipped without mpirun;
# (5) PYTHONPATH starts with the source tree's python/ when it holds the rekindle package,
#     and --no-pythonpath leaves it as given; skipped while python/rekindle/ is absent;
# (6) local ranks read /dev/null (on a terminal too: no SIGTTIN, no hang);
# (7) a SIGKILL of rk run leaves no rank and no rank's child, with a PID namespace and without;
# (8) a stack dump swapped for a symlink is refused and not named by the hang event;
# (9) --stack-dir is made if missing, holds a private 0700 directory, and is refused (exit 2)
#     when writable by others without the sticky bit or another user's;
# (10) MASTER_ADDR and MASTER_PORT given to rk run are kept (and, under (4), a launch whose
#     launcher arguments name hosts gets no MASTER_ADDR);
# (11) a plain script (every rank exits 0, no hello) is a usage error at once (exit 2), a
#     non-zero exit without a hello is still relaunched;
# (12) rk _rank-env without a launcher's variables: exit 2; SLURM_TASKS_PER_NODE bounded;
# (13) an rk outside its build tree: no source-tree package on PYTHONPATH; an installed one
#     first unless group-writable (skipped, said once);
# (14) an exception exit event is relaunched and counted against no device; the same
#     exception at the same step in two launches in a row stops (exit 1), as does a worker
#     that exits with the same status before any hello twice; the first line under explicit
#     local names the worker's path and shell-quotes its arguments; a fault of a rank the job
#     does not have is warned of.
# (15) two processes that say hello as the same rank (a worker that reads Open MPI's
#     OMPI_COMM_WORLD_RANK, unset under local: every rank says rank 0, of 1 or of 2): one line
#     that names the rank, both pids and the fix (read RANK, or --launcher mpirun), event
#     usage/stop, exit 2, no relaunch; the same worker under mpirun finishes; a second hello
#     from the rank's own process, or from a child it started, is only ignored (exit 0).
# Skips (77) without python3.
set -u
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_launch_local
w=(python3 "$RK_SRC/tests/launch_worker.py")
unset MASTER_ADDR MASTER_PORT OMP_NUM_THREADS

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
grep "launcher local (--launcher)" "$work/l1.out" | grep -q "OMP_NUM_THREADS=1 for each of the 2 ranks sharing this host" \
  && ok "... and that the ranks get OMP_NUM_THREADS=1" || bad "no OMP_NUM_THREADS in: $(head -1 "$work/l1.out")"
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
check(all(env(l, r).get("OMP_NUM_THREADS") == "1" for l in (0, 1, 2) for r in (0, 1)),
      "OMP_NUM_THREADS=1 for 2 ranks on one host (as torchrun), in every launch: "
      f"{[env(l, 0).get('OMP_NUM_THREADS') for l in (0, 1, 2)]}")
ev = [json.loads(l) for l in open(evf)]
crash = [e for e in ev if e["kind"] == "crash"]
check(len(crash) == 2 and all(e["rank"] == 1 and e["device"] == "2" for e in crash),
      f"two crashes of rank 1 on device 2: {[(e['rank'], e['device']) for e in crash]}")
check(all("launcher exit status 137" in e["detail"] for e in crash),
      "the keeper ended rank 0 and exited with rank 1's status (137)")
# recovered (a recovery time was measured); its size is the bench's business, not a test's:
# 6 s at a load of 28 on 2 cores
check(all(e["recovery_s"] is not None and 0 < e["recovery_s"] < 120 for e in crash),
      f"each crash recovered: {[e['recovery_s'] for e in crash]} s")
q = [e for e in ev if e["kind"] == "quarantine"]
check(len(q) == 1 and q[0]["device"] == "2", f"device 2 quarantined: {q}")
PY

# --- (1b) a stop: ranks that exit 4 wait for the others ---------------------------------------
mkdir -p "$work/stop"
"$RK" run -n 2 --launcher local --health off --quiet --stop-grace 20 -- "${w[@]}" \
  --log "$work/stop" --steps 100000 --rank 1 --stop-delay 1.0 >"$work/stop.out" 2>&1 &
sup=$!
pids+=("$sup")
for ((i = 0; i < 600; i++)); do [[ -e $work/stop/hello.0.0 && -e $work/stop/hello.0.1 ]] && break; sleep 0.05; done
kill -TERM "$sup"
wait "$sup"
st=$?
[[ $st == 130 && -e $work/stop/stopped.0.0 && -e $work/stop/stopped.0.1 ]] \
  && ! grep -q "did not stop within" "$work/stop.out" \
  && ok "rank 0 exited 4 and rank 1 still stopped on its own a second later (exit $st)" \
  || bad "stop: exit $st, stopped: $(ls "$work/stop" | grep stopped | tr '\n' ' '): $(tail -3 "$work/stop.out")"

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
import glob, stat
subs = glob.glob(os.path.join(os.path.realpath(d), f"rk-stacks.*"))
check(len(subs) == 1 and stat.S_IMODE(os.stat(subs[0]).st_mode) == 0o700,
      f"one private stack directory (0700) in the --events directory: {subs}")
want = os.path.join(subs[0] if subs else "", "stacks-rank1-launch0.txt")
check(any("launcher local" in l and f"stack dumps in {subs[0] if subs else '?'}" in l for l in out),
      "the first status line names it")
check(len(h) == 1 and h[0]["rank"] == 1 and h[0].get("stacks") == [want] and want in h[0]["detail"],
      f"the hang event names the dump: {h[0].get('stacks') if h else None}")
check(os.path.isfile(want) and "hung_in_compute_for_test" in open(want).read(),
      "the dump is in it")
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
  && ! grep -q "] relaunch " "$work/noexec.out" && ok "an unexecutable worker: one message, exit 2" \
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
# one node, no pml chosen: --mca pml ob1 unless this host has an RDMA device (UCX's probing)
import os
rdma = os.path.isdir("/sys/class/infiniband") and any(not n.startswith(".") for n in os.listdir("/sys/class/infiniband"))
want = None if rdma else "ob1"
got = [x.get("OMPI_MCA_pml") for x in e]
print(("ok - " if got == [want, want] else "FAIL - ") + f"one node, no pml chosen, RDMA {rdma}: the ranks' OMPI_MCA_pml {got}, {want} wanted")
PY
  # a pml the user chose is left alone
  mkdir -p "$work/pml"
  OMPI_MCA_pml=^ucx timeout 120 "$RK" run -n 2 --launcher mpirun --health off --quiet -- "${w[@]}" \
    --log "$work/pml" --steps 2 >"$work/pml.out" 2>&1
  st=$?
  got=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("OMPI_MCA_pml"))' "$work/pml/env.0.1.json" 2>&1)
  [[ $st == 0 && $got == "^ucx" ]] && ok "OMPI_MCA_pml=^ucx of the user reaches the ranks as it is" \
    || bad "OMPI_MCA_pml=^ucx: exit $st, the rank's '$got'"
  # launcher arguments that name hosts: no MASTER_ADDR=127.0.0.1, said once
  mkdir -p "$work/mh"
  timeout 120 "$RK" run -n 2 --launcher mpirun --launcher-arg --host --launcher-arg localhost:2 \
    --health off --quiet -- "${w[@]}" --log "$work/mh" --steps 3 >"$work/mh.out" 2>&1
  st=$?
  [[ $st == 0 && $(grep -c "MASTER_ADDR not set: the ranks may run on other hosts" "$work/mh.out") == 1 ]] \
    && python3 -c 'import json,sys; sys.exit("MASTER_ADDR" in json.load(open(sys.argv[1])))' \
      "$work/mh/env.0.1.json" \
    && ok "with --host in the launcher arguments MASTER_ADDR is left unset, said once" \
    || bad "--host: exit $st: $(grep 'rk run' "$work/mh.out" | head -3)"
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
# --- (6) stdin: a local rank reads /dev/null -------------------------------------------------
mkdir -p "$work/in"
echo "not for the ranks" | timeout 60 "$RK" run -n 2 --launcher local --health off --quiet \
  -- "${w[@]}" --log "$work/in" --steps 2 --read-stdin >"$work/in.out" 2>&1
st=$?
[[ $st == 0 && $(json "$work/in/stdin.0.0.json" fd0) == /dev/null \
  && $(json "$work/in/stdin.0.1.json" line) == "" ]] \
  && ok "local ranks read /dev/null, not rk run's stdin (exit $st)" \
  || bad "stdin: exit $st: $(cat "$work"/in/stdin.* 2>&1) $(tail -2 "$work/in.out")"
if command -v script >/dev/null; then
  # on a terminal, a read of it from the keeper's process group would stop the rank (SIGTTIN)
  # and read as a hang
  timeout 60 script -qec "$(printf '%q ' "$RK" run -n 1 --launcher local --health off --quiet \
    --max-restarts 0 --heartbeat-timeout 6 -- "${w[@]}" --log "$work/in" --steps 2 --read-stdin)" \
    /dev/null >"$work/tty.out" 2>&1 </dev/null
  st=$?
  [[ $st == 0 ]] && ! grep -q "hang" "$work/tty.out" \
    && ok "on a terminal, a rank that reads stdin is not stopped (exit $st)" \
    || bad "terminal stdin: exit $st: $(grep 'rk run' "$work/tty.out" | tail -3)"
else
  echo "skip - script not found: the terminal case not tested"
fi

# --- (7) a SIGKILL of rk run leaves no rank and no rank's child -------------------------------
alive() { # processes whose argv holds $1, zombies aside
  local n=0 f
  for f in $(grep -l -a -F -- "$1" /proc/[0-9]*/cmdline 2>/dev/null); do
    [[ $(awk '{print $3}' "${f%cmdline}stat" 2>/dev/null) == [^Z] ]] && n=$((n + 1))
  done
  echo "$n"
}
# rk run and its keeper (the worker's argv is in theirs), 2 ranks, 2 children of the ranks
for ns in 1 0; do
  tag="rk-it-kill-$$-$ns"
  mkdir -p "$work/kill$ns"
  RK_RUN_PIDNS=$ns "$RK" run -n 2 --launcher local --health off --quiet -- "${w[@]}" \
    --log "$work/kill$ns" --steps 100000 --child "$tag" --tag "$tag" >"$work/kill$ns.out" 2>&1 &
  sup=$!
  pids+=("$sup")
  for ((i = 0; i < 300; i++)); do [[ $(alive "$tag") == 6 ]] && break; sleep 0.1; done
  before=$(alive "$tag")
  kill -9 "$sup"
  wait "$sup" 2>/dev/null
  for ((i = 0; i < 100; i++)); do [[ $(alive "$tag") == 0 ]] && break; sleep 0.05; done
  after=$(alive "$tag")
  [[ $before == 6 && $after == 0 ]] \
    && ok "RK_RUN_PIDNS=$ns: after a SIGKILL of rk run no rank nor rank's child is left ($before before)" \
    || bad "RK_RUN_PIDNS=$ns: $before processes before the SIGKILL, $after after"
done

# --- (8) a hostile stack file: a symlink swapped in is refused and not named ------------------
mkdir -p "$work/hs"
echo "the target's secret line" >"$work/target"
timeout 120 "$RK" run -n 2 --launcher local --heartbeat-timeout 2 --health off --quiet \
  --max-restarts 0 --events "$work/hs/events.jsonl" -- "${w[@]}" --hang-at 8 --steps 30 \
  --hostile-stacks --hostile-target "$work/target" >"$work/hs.out" 2>&1
it_count python3 - "$work/hs.out" "$work/hs/events.jsonl" <<'PY'
import json, sys
out, ev = open(sys.argv[1]).read(), [json.loads(l) for l in open(sys.argv[2])]
def check(cond, what):
    print(("ok - " if cond else "FAIL - ") + what)
h = [e for e in ev if e["kind"] == "hang"]
check(len(h) == 1 and not h[0].get("stacks") and "stacks in" not in h[0]["detail"],
      f"the hang event names no refused dump: {h[0].get('stacks') if h else 'no hang'}")
check("rank 1: no stack dump in" in out and "secret" not in out,
      "the link was refused and its target not copied")
PY

# --- (9) --stack-dir: made if missing, checked, a private directory inside --------------------
mkdir -p "$work/sd1"
timeout 60 "$RK" run -n 1 --launcher local --health off --quiet --stack-dir "$work/sd1/a/b" \
  -- "${w[@]}" --steps 2 >"$work/sd1.out" 2>&1
st=$?
# (the rank opened its dump ahead and wrote nothing: the empty dump and the private directory
# are removed at the end; (2) checks one that holds a dump)
[[ $st == 0 && -d $work/sd1/a/b && -z $(ls -A "$work/sd1/a/b") ]] \
  && grep -q "stack dumps in $work/sd1/a/b/rk-stacks\.[0-9]*\.[A-Za-z0-9]\{6\}$" "$work/sd1.out" \
  && ok "a missing --stack-dir is made, holds a private directory named in the first line, left empty" \
  || bad "--stack-dir a/b: exit $st, left: $(ls -A "$work/sd1/a/b" 2>&1): $(head -1 "$work/sd1.out")"
mkdir -p "$work/ww" "$work/sticky"
chmod 0777 "$work/ww"
chmod 1777 "$work/sticky"
timeout 60 "$RK" run -n 1 --launcher local --health off --quiet --stack-dir "$work/ww" \
  -- "${w[@]}" --steps 2 >"$work/ww.out" 2>&1
st=$?
[[ $st == 2 && $(wc -l <"$work/ww.out") == 1 ]] \
  && grep -q "writable by others without the sticky bit" "$work/ww.out" \
  && ok "a world-writable --stack-dir without the sticky bit: one line, exit 2" \
  || bad "--stack-dir 0777: exit $st: $(cat "$work/ww.out")"
timeout 60 "$RK" run -n 1 --launcher local --health off --quiet --stack-dir "$work/sticky" \
  -- "${w[@]}" --steps 2 >"$work/sticky.out" 2>&1
st=$?
[[ $st == 0 ]] && grep -q "stack dumps in $work/sticky/rk-stacks\." "$work/sticky.out" \
  && ok "a sticky world-writable --stack-dir holds the private directory (exit 0)" \
  || bad "--stack-dir 1777: exit $st: $(tail -2 "$work/sticky.out")"
if [[ $(id -u) == 0 ]]; then
  mkdir -p "$work/other"
  chown 65534 "$work/other"
  timeout 60 "$RK" run -n 1 --launcher local --health off --quiet --stack-dir "$work/other" \
    -- "${w[@]}" --steps 2 >"$work/other.out" 2>&1
  st=$?
  [[ $st == 2 ]] && grep -q "owned by uid 65534" "$work/other.out" \
    && ok "a --stack-dir of another user: exit 2" \
    || bad "--stack-dir of uid 65534: exit $st: $(cat "$work/other.out")"
fi
touch "$work/afile"
timeout 60 "$RK" run -n 1 --launcher local --health off --quiet --stack-dir "$work/afile/x" \
  -- "${w[@]}" --steps 2 >"$work/sdf.out" 2>&1
st=$?
[[ $st == 2 ]] && ok "a --stack-dir under a file: exit 2" || bad "--stack-dir under a file: exit $st"

# --- (10) MASTER_ADDR and MASTER_PORT the user set are kept -----------------------------------
mkdir -p "$work/ma"
MASTER_ADDR=10.1.2.3 MASTER_PORT=23456 OMP_NUM_THREADS=3 timeout 60 "$RK" run -n 2 --launcher local --health off \
  --quiet -- "${w[@]}" --log "$work/ma" --steps 2 >"$work/ma.out" 2>&1
st=$?
[[ $st == 0 && $(json "$work/ma/env.0.1.json" MASTER_ADDR) == 10.1.2.3 \
  && $(json "$work/ma/env.0.1.json" MASTER_PORT) == 23456 && $(json "$work/ma/env.0.1.json" OMP_NUM_THREADS) == 3 ]] \
  && grep "launcher local" "$work/ma.out" | grep -q "kept from the environment: MASTER_ADDR=10.1.2.3 MASTER_PORT=23456" \
  && ! grep -q "OMP_NUM_THREADS=1" "$work/ma.out" \
  && ok "the user's MASTER_ADDR, MASTER_PORT and OMP_NUM_THREADS are kept, and said so" \
  || bad "MASTER_ADDR kept: exit $st: $(head -1 "$work/ma.out")"

# --- (10c) the rank that died first is blamed, even when its connection closes last ----------
# rank 2 lends its heartbeat socket to a process outside the job (as a DataLoader worker it
# forked would hold it), then SIGKILLs itself at step 5: the keeper ends ranks 0 and 1, whose
# connections close while rank 2's stays open; the crash is rank 2's (device 2), as the keeper
# saw it end first, not rank 0's whose close was read first
mkdir -p "$work/lend"
python3 - "$work/lend/sock" >"$work/lend/holder.out" 2>&1 <<'PY' &
import socket, sys, time
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(sys.argv[1]); srv.listen(4)
print("listening", flush=True)
held = []
while True:
    c, _ = srv.accept()
    msg, fds, _, _ = socket.recv_fds(c, 1, 4)
    held += fds
    c.send(b"k")
    print("holding", fds, flush=True)
PY
holder=$!
pids+=("$holder")
wait_for "grep -q listening $work/lend/holder.out" 30 || bad "the socket holder did not start"
timeout 60 "$RK" run -n 3 --launcher local --health off --failure-threshold 5 --events "$work/lend.ev" \
  -- "${w[@]}" --log "$work/lend" --steps 20 --rank 2 --launches 0 --crash-at 5 \
  --lend-socket "$work/lend/sock" >"$work/lend.out" 2>&1
st=$?
kill "$holder" 2>/dev/null
crash=$(grep -m1 '"kind":"crash"' "$work/lend.ev")
[[ $st == 0 ]] && grep -q holding "$work/lend/holder.out" && [[ $crash == *'"rank":2,"device":"2"'* ]] \
  && ok "a crash is blamed on the rank the keeper saw end first, though its connection stayed open" \
  || bad "lent socket: exit $st, $(grep -c holding "$work/lend/holder.out") held: ${crash:0:300}"

# --- (10b) a rank killed after every rank said bye done: the job is finished, no relaunch ----
mkdir -p "$work/dab"
timeout 60 "$RK" run -n 2 --launcher local --health off --events "$work/dab.ev" -- "${w[@]}" \
  --log "$work/dab" --steps 5 --rank 1 --die-after-bye >"$work/dab.out" 2>&1
st=$?
[[ $st == 0 && -e $work/dab/bye.0.1 ]] && ! grep -q "] relaunch " "$work/dab.out" \
  && ! grep -q '"kind":"crash"' "$work/dab.ev" && [[ ! -e $work/dab/env.1.0.json ]] \
  && ok "a rank SIGKILLed after every rank said bye done: finished, not relaunched" \
  || bad "killed after bye: exit $st: $(grep 'rk run' "$work/dab.out" | tail -3)"

# --- (11) a plain script that never says hello ------------------------------------------------
timeout 60 "$RK" run -n 2 --launcher local --health off -- python3 -c 'print("plain")' \
  >"$work/plain.out" 2>&1
st=$?
[[ $st == 2 && $(grep -c "never_connected" "$work/plain.out") == 2 ]] \
  && grep -q "rekindle.Worker.*docs/protocol.md" "$work/plain.out" \
  && ! grep -q "] relaunch" "$work/plain.out" \
  && ok "ranks that exit 0 without a hello: a usage error at once, pointing to the protocol (exit 2)" \
  || bad "plain script: exit $st: $(grep 'rk run' "$work/plain.out")"
timeout 60 "$RK" run -n 1 --launcher local --health off --max-restarts 1 -- python3 -c \
  'import sys; sys.exit(1)' >"$work/plain1.out" 2>&1
st=$?
[[ $st == 1 ]] && grep -q "] relaunch 1" "$work/plain1.out" \
  && ok "a rank that exits 1 without a hello is still relaunched (exit $st)" \
  || bad "exit 1 without hello: exit $st: $(grep 'rk run' "$work/plain1.out")"

# --- (14) an exception of the job's code; the repeat stops; a fault of a rank not in the job ---
# rank 1 raises at step 5 in launch 0 only: relaunched on both devices, nothing counted (with
# --failure-threshold 1 a counted failure would quarantine device 1 and shrink the job)
mkdir -p "$work/ex1" "$work/ex2"
timeout 60 "$RK" run -n 2 --launcher local --health off --failure-threshold 1 \
  --events "$work/ex1.ev" -- "${w[@]}" --steps 10 --rank 1 --launches 0 --raise-at 5 \
  --log "$work/ex1" >"$work/ex1.out" 2>&1
st=$?
[[ $st == 0 ]] && grep -q "] relaunch 1 on 2 ranks" "$work/ex1.out" \
  && grep -q " 0 devices quarantined" "$work/ex1.out" \
  && python3 -c 'import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
sys.exit(int(not [e for e in ev if e["kind"] == "exception" and not e["device"]]
         or bool([e for e in ev if e["kind"] == "quarantine"])))' "$work/ex1.ev" \
  && ok "an exception exit event: relaunched on every device, counted against none (exit 0)" \
  || bad "exception once: exit $st: $(grep 'rk run' "$work/ex1.out" | tail -5)"
# the same exception at the same step in launches 0 and 1: stop after launch 1, exit 1
timeout 60 "$RK" run -n 2 --launcher local --health off -- "${w[@]}" --steps 10 --rank 1 \
  --launches 0,1,2 --raise-at 5 --log "$work/ex2" >"$work/ex2.out" 2>&1
st=$?
[[ $st == 1 ]] && grep -q "the same exception at step 5 in two launches in a row" "$work/ex2.out" \
  && grep -q "] relaunch 1 " "$work/ex2.out" && ! grep -q "] relaunch 2 " "$work/ex2.out" \
  && grep -q " 0 devices quarantined" "$work/ex2.out" \
  && ok "the same exception at the same step twice: stopped after one relaunch (exit 1)" \
  || bad "exception twice: exit $st: $(grep 'rk run' "$work/ex2.out" | tail -5)"
# a checkpoint the job's own rule refused (rekindle.torch: an exit event ckpt_refused, exit 5)
# at the same step in launches 0 and 1: counted against no device (--failure-threshold 1 would
# quarantine one at the first count), stopped after one relaunch, exit 1
timeout 60 "$RK" run -n 2 --launcher local --health off --failure-threshold 1 \
  --events "$work/cr.ev" -- "${w[@]}" --steps 10 --rank 0 --launches 0,1,2 --raise-at 5 \
  --raise-kind ckpt_refused --raise-status 5 \
  --raise-detail "checkpoint of step 5 refused: item 'model.w': element 3 is inf" \
  --log "$work/ex2" >"$work/cr.out" 2>&1
st=$?
[[ $st == 1 ]] && grep -q "refused its checkpoint at step 5 in two launches in a row" "$work/cr.out" \
  && grep -q " 0 devices quarantined" "$work/cr.out" && ! grep -q '"kind":"guard_failed"' "$work/cr.ev" \
  && [[ $(grep -c '"kind":"ckpt_refused","rank":0,"device":null' "$work/cr.ev") -ge 1 ]] \
  && ok "a checkpoint refused by the job's own rule: no device blamed, stopped when it repeats (exit 1)" \
  || bad "ckpt_refused: exit $st: $(grep 'rk run' "$work/cr.out" | tail -5)"
# a worker that cannot start (no such module) stops after the second try; the first line
# names the interpreter's path and quotes -c's argument; a fault of rank 7 of 2 is warned of
timeout 60 "$RK" run -n 2 --launcher local --health off --inject crash@step=5:rank=7 -- \
  python3 -c 'import no_such_module_rk' >"$work/nomod.out" 2>&1
st=$?
[[ $st == 1 ]] && grep -q "exits with status 1 before it connects, twice in a row" "$work/nomod.out" \
  && grep -q "] relaunch 1 " "$work/nomod.out" && ! grep -q "] relaunch 2 " "$work/nomod.out" \
  && ok "a worker that exits 1 before any hello twice: stopped (exit 1)" \
  || bad "cannot start: exit $st: $(grep 'rk run' "$work/nomod.out" | tail -5)"
grep -qF "launcher local (--launcher): rk run forks 2 ranks: $(command -v python3) -c 'import no_such_module_rk';" \
  "$work/nomod.out" && ok "the first line: the worker's path from PATH, its arguments shell-quoted" \
  || bad "first line: $(grep 'launcher local' "$work/nomod.out")"
[[ $(grep -c "warning: fault 0 (crash on rank 7) never fires: the job has 2 ranks" "$work/nomod.out") == 1 ]] \
  && ok "a fault of a rank the job does not have: one warning line" \
  || bad "fault of rank 7: $(grep 'fault' "$work/nomod.out")"

# --- (15) two processes say hello as the same rank --------------------------------------------
for v in "--ompi-world" ""; do # rank 0 of 1 (rank and world from Open MPI's), rank 0 of 2
  timeout 120 "$RK" run -n 2 --launcher local --health off --events "$work/dup$v.ev" -- "${w[@]}" \
    --steps 100000 --ompi-rank $v >"$work/dup$v.out" 2>&1
  st=$?
  line=$(grep "rk run: .*two processes of the launch said hello as rank 0, pid [0-9]* and pid [0-9]*" \
    "$work/dup$v.out")
  pids=$(sed -n 's/.*said hello as rank 0, pid \([0-9]*\) and pid \([0-9]*\).*/\1 \2/p' <<<"$line")
  [[ $st == 2 && $(wc -l <<<"$line") == 1 && -n $pids && ${pids% *} != "${pids#* }" ]] \
    && [[ $line == *"read RANK and WORLD_SIZE"*"or give --launcher mpirun; stopping"* ]] \
    && ! grep -q "] relaunch\|never_connected\|never connected" "$work/dup$v.out" \
    && python3 -c 'import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
sys.exit(not (len(ev) == 1 and ev[0]["kind"] == "usage" and ev[0]["action"] == "stop"
              and ev[0]["rank"] == 0 and ev[0]["device"] is None
              and "said hello as rank 0" in ev[0]["detail"]))' "$work/dup$v.ev" \
    && ok "rank 0 said by two processes (${v:-rank 0 of 2}): one line naming pids $pids and the fix, event usage/stop, exit 2" \
    || bad "duplicate rank 0 (${v:-of 2}): exit $st: $(grep 'rk run' "$work/dup$v.out" | tail -4) $(cat "$work/dup$v.ev" 2>&1)"
done
if command -v mpirun >/dev/null; then
  timeout 120 "$RK" run -n 2 --launcher mpirun --health off --quiet -- "${w[@]}" --steps 5 \
    --ompi-rank --ompi-world >"$work/dupmpi.out" 2>&1
  st=$?
  [[ $st == 0 ]] && ok "the same worker under --launcher mpirun finishes (exit 0)" \
    || bad "OMPI_COMM_WORLD_RANK under mpirun: exit $st: $(grep 'rk run' "$work/dupmpi.out" | tail -3)"
else
  echo "skip - mpirun not found: the duplicate worker under mpirun not run"
fi
for v in --hello-again --child-hello; do # the rank's own process again, a child of it
  timeout 120 "$RK" run -n 2 --launcher local --health off --quiet -- "${w[@]}" --steps 50 $v \
    >"$work/re$v.out" 2>&1
  st=$?
  [[ $st == 0 && $(grep -c "ignored a hello for rank [01] of 2" "$work/re$v.out") == 2 ]] \
    && ! grep -q "two processes" "$work/re$v.out" \
    && ok "$v: the second hello of each rank is ignored, the job finishes (exit 0)" \
    || bad "$v: exit $st: $(grep 'rk run' "$work/re$v.out" | tail -4)"
done

# --- (12) rk _rank-env without a launcher's variables, and a bounded SLURM_TASKS_PER_NODE --------
env -i PATH="$PATH" RANK=7 "$RK" _rank-env -- env >"$work/re.out" 2>&1
st=$?
[[ $st == 2 && $(wc -l <"$work/re.out") == 1 ]] && grep -q "no rank from the launcher" "$work/re.out" \
  && ok "rk _rank-env without a launcher's variables: one line, exit 2 (no inherited RANK)" \
  || bad "_rank-env without variables: exit $st: $(cat "$work/re.out")"
env -i PATH="$PATH" SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=1 SLURM_NODEID=0 \
  SLURM_TASKS_PER_NODE=9223372036854775807 "$RK" _rank-env -- env >"$work/re2.out" 2>&1
grep -qx "LOCAL_WORLD_SIZE=2" "$work/re2.out" && grep -qx "LOCAL_RANK=1" "$work/re2.out" \
  && ok "a SLURM_TASKS_PER_NODE beyond the world: the local values are the world's" \
  || bad "SLURM_TASKS_PER_NODE huge: $(grep LOCAL "$work/re2.out")"
env -i PATH="$PATH" SLURM_PROCID=1 SLURM_NTASKS=4 SLURM_LOCALID=1 SLURM_NODEID=1 \
  SLURM_TASKS_PER_NODE="2(x2)" "$RK" _rank-env -- env >"$work/re3.out" 2>&1
grep -qx "LOCAL_WORLD_SIZE=2" "$work/re3.out" && grep -qx "WORLD_SIZE=4" "$work/re3.out" \
  && ok "SLURM_TASKS_PER_NODE 2(x2): local world 2 of 4" \
  || bad "SLURM 2(x2): $(grep SIZE "$work/re3.out")"
# across hosts (RK_DEVICES_BY_HOST=1): a rank's CUDA_VISIBLE_DEVICES is its host's devices of
# the launch, in order, mapped through a CUDA_VISIBLE_DEVICES the launcher gave (Slurm's)
re_env() { env -i PATH="$PATH" OMPI_COMM_WORLD_RANK="$1" OMPI_COMM_WORLD_SIZE=4 RK_DEVICES_BY_HOST=1 \
  RK_DEVICES="${2}" ${3:+CUDA_VISIBLE_DEVICES=$3} "$RK" _rank-env -- printenv CUDA_VISIBLE_DEVICES 2>&1; }
[[ "$(re_env 1 h1:0,h1:2,h2:0,h2:1)" == 0,2 && "$(re_env 3 h1:0,h1:2,h2:0,h2:1)" == 0,1 ]] \
  && ok "across hosts: CUDA_VISIBLE_DEVICES 0,2 on h1 (its devices 0 and 2), 0,1 on h2" \
  || bad "across hosts: $(re_env 1 h1:0,h1:2,h2:0,h2:1) / $(re_env 3 h1:0,h1:2,h2:0,h2:1)"
[[ "$(re_env 0 fd00::1:0,fd00::1:3,h2:0,h2:1 5,6,7,8)" == 5,8 ]] \
  && ok "an IPv6 host's devices 0,3 through the launcher's CUDA_VISIBLE_DEVICES 5,6,7,8: 5,8" \
  || bad "IPv6 host through 5,6,7,8: $(re_env 0 fd00::1:0,fd00::1:3,h2:0,h2:1 5,6,7,8)"
out=$(re_env 0 h1:x,h1:1,h2:0,h2:1)
st=$?
[[ $st == 2 && $out == *"'x' is not a device index"* ]] && ok "a device index that is not one: exit 2, named" \
  || bad "h1:x: exit $st: $out"
out=$(re_env 1 h1:0,h1:4,h2:0,h2:1 5,6)
st=$?
[[ $st == 2 && $out == *"CUDA_VISIBLE_DEVICES (5,6) has no item 4"* ]] \
  && ok "a device past the launcher's CUDA_VISIBLE_DEVICES: exit 2, named" || bad "h1:4 of 5,6: exit $st: $out"
[[ "$(env -i PATH="$PATH" OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 RK_DEVICES=a:0,b:0 \
  CUDA_VISIBLE_DEVICES=a:0,b:0 "$RK" _rank-env -- printenv CUDA_VISIBLE_DEVICES)" == a:0,b:0 ]] \
  && ok "one host's ids that hold ':' (no RK_DEVICES_BY_HOST): CUDA_VISIBLE_DEVICES as rk run set it" \
  || bad "one host, ids with ':'"

# --- (13) PYTHONPATH of an rk outside its build tree ----------------------------------------
# (outside the build directory: $work is inside it, where the source tree's package is used)
inst=$(mktemp -d "${TMPDIR:-/tmp}/rk-it-inst.XXXXXX")
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$work" "$inst"' EXIT
mkdir -p "$inst/bin" "$inst/share/rekindle/python/rekindle" "$work/pp3" "$work/pp4" "$work/pp5"
cp "$RK" "$inst/bin/rk"
PYTHONPATH=/given timeout 60 "$inst/bin/rk" run -n 1 --health off --quiet -- "${w[@]}" \
  --steps 2 --log "$work/pp3" >"$work/pp3.out" 2>&1
[[ $(json "$work/pp3/env.0.0.json" PYTHONPATH) == /given ]] \
  && ok "an rk outside the build tree without share/rekindle/python: PYTHONPATH as given" \
  || bad "copied rk: PYTHONPATH $(json "$work/pp3/env.0.0.json" PYTHONPATH)"
touch "$inst/share/rekindle/python/rekindle/__init__.py"
chmod 0755 "$inst/share/rekindle/python" "$inst/share/rekindle/python/rekindle"
PYTHONPATH=/given timeout 60 "$inst/bin/rk" run -n 1 --health off --quiet -- "${w[@]}" \
  --steps 2 --log "$work/pp4" >"$work/pp4.out" 2>&1
[[ $(json "$work/pp4/env.0.0.json" PYTHONPATH) == "$inst/share/rekindle/python:/given" ]] \
  && ok "an installed share/rekindle/python comes first on PYTHONPATH" \
  || bad "installed: PYTHONPATH $(json "$work/pp4/env.0.0.json" PYTHONPATH)"
chmod 0775 "$inst/share/rekindle/python/rekindle"
PYTHONPATH=/given timeout 60 "$inst/bin/rk" run -n 1 --health off --quiet -- "${w[@]}" \
  --steps 2 --log "$work/pp5" >"$work/pp5.out" 2>&1
[[ $(json "$work/pp5/env.0.0.json" PYTHONPATH) == /given ]] \
  && [[ $(grep -c "is not on the ranks' PYTHONPATH: it (or its rekindle/) is writable" "$work/pp5.out") == 1 ]] \
  && ok "a group-writable package directory is skipped, said once" \
  || bad "group-writable: PYTHONPATH $(json "$work/pp5/env.0.0.json" PYTHONPATH): $(head -3 "$work/pp5.out")"
it_finish
