#!/usr/bin/env bash
# The job lives and dies with `rk run` (docs/run.md, "How the job is held"), with real ranks
# (forked by rk run, or Open MPI's) of the data-free examples/python_worker.py, real signals
# and sockets:
# (1) SIGKILL of rk run, in its PID namespace (ranks forked by rk run, and under mpirun) and in
#     the subreaper fallback (RK_RUN_PIDNS=0), and SIGHUP and SIGTERM leave no process of the
#     job and no checkpoint written after; the snapshot directories the SIGKILLed jobs left
#     are removed by the next job (said);
# (2) a worker whose supervisor vanished (its socket closes) stops without saving: the Python
#     worker and rk train (with Fashion-MNIST);
# (3) teardown reaches a rank that never said hello and ignores SIGTERM;
# (4) a stranger's hello for rank 0 naming the pid of a `sleep` is refused, the sleep lives,
#     the job finishes; the socket is 0600 in a 0700 directory;
# (5) a flood (5000 bad lines on one connection, 300 connections with one bad line each,
#     3000 connect/close cycles, 100 silent connections) before the ranks' hello locks nobody
#     out and rk run's output stays short;
# (6) an unexecutable launcher is one message and exit 2; a single-node job's listeners (mpirun's
#     out-of-band and PMIx ones) are all on loopback (ss);
# (7) jobs started one after another in their PID namespaces get different Open MPI job ids
#     (their shared memory and session directories never meet).
# Skips (77) without mpirun or python3.
set -u
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_lifecycle
# rk run's socket directory goes in TMPDIR (at most 31 bytes): a short private one, so the
# directories a SIGKILLed rk run cannot remove go with the test
TMPDIR=$(mktemp -d /tmp/itlc.XXXXXX)
export TMPDIR
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$work" "$TMPDIR"' EXIT
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
pyw="$RK_SRC/examples/python_worker.py"

# job_procs TOKEN: pids of processes whose command line holds TOKEN (rk run, keeper, mpirun,
# ranks: the token is in the worker's arguments)
job_procs() { pgrep -f -- "$1" | tr '\n' ' '; }
ck_state() { cat "$1"/python_worker.rank*.json 2>/dev/null | md5sum; }

# --- (1) signals to rk run -------------------------------------------------------------------
# kill_case NAME SIGNAL [env...]: 2 ranks checkpointing every 5 steps; signal rk run once the
# job has checkpointed; nothing of the job may be left (10 s at most), and no checkpoint
# changes after rk run exited
kill_case() {
  local name=$1 sig=$2; shift 2
  local tok="$work/$name.token" ck="$work/$name.ck"
  # RK_SNAP_PARENT: the snapshot directory of an rk run killed by SIGKILL (which cannot remove
  # it) goes with $work, not left in /dev/shm
  env RK_SNAP_PARENT="$work" "$@" "$RK" run -n 2 --launcher "${launcher:-auto}" --ckpt-dir "$ck" --quiet -- python3 "$pyw" --steps 1000000 \
    --sleep 0.01 --ckpt-every 5 --result "$tok" >"$work/$name.out" 2>&1 &
  local sup=$!
  pids+=("$sup")
  if ! wait_for "[[ -e $ck/python_worker.rank1.json ]]" 60; then
    bad "$name: no checkpoint within 60 s: $(tail -3 "$work/$name.out")"; return
  fi
  local before; before=$(job_procs "$tok")
  kill -"$sig" "$sup"
  wait "$sup" 2>/dev/null
  local st=$?
  local ck0; ck0=$(ck_state "$ck")
  wait_for "[[ -z \"\$(job_procs $tok)\" ]]" 10
  local left; left=$(job_procs "$tok")
  [[ -z $left ]] && ok "$name: rk run exit $st; nothing of the job is left (was: $before)" \
    || bad "$name: still running after rk run exited: $left ($(ps -o pid,ppid,args -p ${left// /,} | tail -n +2))"
  [[ $(ck_state "$ck") == "$ck0" ]] && ok "$name: no checkpoint written after rk run was gone" \
    || bad "$name: checkpoints changed after rk run was gone"
  for p in $left; do kill -9 "$p" 2>/dev/null; done
}
kill_case kill9 KILL
launcher=mpirun kill_case kill9_mpirun KILL
kill_case kill9_nopidns KILL RK_RUN_PIDNS=0
grep -q "no PID namespace for the job (RK_RUN_PIDNS=0)" "$work/kill9_nopidns.out" \
  && ok "the fallback says once that the job has no PID namespace" || bad "no fallback notice"
# what the SIGKILLed jobs left in their snapshot parent (a SIGKILL removes nothing): the next
# job on the node removes it, says so, and leaves its own directory in use alone
left=$(find "$work" -maxdepth 1 -name 'rk-snap-*' -type d | wc -l)
RK_SNAP_PARENT="$work" "$RK" run -n 1 --ckpt-dir "$work/sweep.ck" -- python3 "$pyw" --steps 3 \
  --sleep 0 --result "$work/sweep.token" >"$work/sweep.out" 2>&1
after=$(find "$work" -maxdepth 1 -name 'rk-snap-*' -type d | wc -l)
# (each kill case's rk run already removed what the one before it left: the last one's is here)
((left >= 1)) && grep -Eq "removed $left snapshot director(y|ies) left by jobs that were killed" "$work/sweep.out" &&
  ((after == 0)) && ok "the next job removed the $left snapshot directories the SIGKILLed jobs left, and said so" ||
  bad "sweep: $left left before, $after after: $(grep -i 'snapshot' "$work/sweep.out" | head -3)"
kill_case hup HUP
grep -q "interrupted" "$work/hup.out" && ok "SIGHUP is handled like SIGTERM (interrupted)" \
  || bad "SIGHUP: $(tail -3 "$work/hup.out")"
kill_case term TERM
# --- (2) a worker whose supervisor vanished stops without saving ----------------------------
# fake_sup SOCKET: accept one hello, close everything once the worker has sent a step (it is
# running: 60 s at most), report the close
cat >"$work/fake_sup.py" <<'PY'
import json, os, socket, sys, time
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.bind(path); s.listen(4)
c, _ = s.accept()
c.settimeout(60)
buf = b""
def stepped():  # a whole line of type step has come
    return any(json.loads(l).get("type") == "step" for l in buf.split(b"\n")[:-1] if l.strip())
while not stepped():
    d = c.recv(4096)
    if not d:
        break
    buf += d
print(buf.split(b"\n")[0].decode().strip(), flush=True)
c.close(); s.close()
print("closed", flush=True)
time.sleep(120)
PY
python3 "$work/fake_sup.py" "$work/fake.sock" >"$work/fake.out" 2>&1 &
fake=$!
pids+=("$fake")
wait_for "[[ -S $work/fake.sock ]]" 10
RK_HEARTBEAT="$work/fake.sock" RK_CKPT_DIR="$work/pyeof.ck" timeout 60 python3 "$pyw" \
  --steps 1000000 --sleep 0.01 --ckpt-every 5 >"$work/pyeof.out" 2>&1
st=$?
ck0=$(ck_state "$work/pyeof.ck")
[[ $st == 1 ]] && grep -q "the supervisor has gone" "$work/pyeof.out" \
  && ok "the Python worker stops (exit 1) when its supervisor's socket closes" \
  || bad "python worker on EOF: exit $st: $(tail -2 "$work/pyeof.out")"
kill "$fake" 2>/dev/null
if [[ -e "$DATA/train-images-idx3-ubyte.gz" || -e "$DATA/train-images-idx3-ubyte" ]]; then
  python3 "$RK_SRC/tests/make_subset.py" "$DATA" "$work/sub" 6400 500 >/dev/null
  rm -f "$work/fake.sock"
  python3 "$work/fake_sup.py" "$work/fake.sock" >"$work/fake2.out" 2>&1 &
  fake=$!
  pids+=("$fake")
  wait_for "[[ -S $work/fake.sock ]]" 10
  RK_HEARTBEAT="$work/fake.sock" timeout 120 "$RK" train --data "$work/sub" --threads 1 \
    --no-eval --epochs 50 --ckpt-dir "$work/treof.ck" --ckpt-every 4 >"$work/treof.out" 2>&1
  st=$?
  [[ $st == 1 ]] && grep -q "the supervisor has gone" "$work/treof.out" \
    && ok "rk train stops (exit 1) when its supervisor's socket closes: $(grep -o 'step [0-9]*: the supervisor has gone\|no checkpoint is written after it' "$work/treof.out" | head -1)" \
    || bad "rk train on EOF: exit $st: $(tail -2 "$work/treof.out")"
  kill "$fake" 2>/dev/null
else
  echo "# skipped the rk train part: Fashion-MNIST not in $DATA"
fi

# --- (3) teardown reaches a rank that never said hello ---------------------------------------
# rank 1 ignores SIGTERM and never connects; rank 0 is killed: rk run tears the launch down
# and gives up (--max-restarts 0); rank 1 must be gone too
cat >"$work/slow_rank.sh" <<EOF
if [ "\$RANK" = 1 ]; then
  exec python3 -c "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)" "$work/slow.token"
fi
exec python3 "$pyw" --steps 1000000 --sleep 0.01 --pid-file "$work/slow.pid"
EOF
"$RK" run -n 2 --quiet --max-restarts 0 --startup-timeout 600 -- bash "$work/slow_rank.sh" \
  >"$work/slow.out" 2>&1 &
sup=$!
pids+=("$sup")
if wait_for "[[ -s $work/slow.pid && -n \"\$(job_procs $work/slow.token)\" ]]" 60; then
  for p in $(pgrep -f -- "$pyw --steps 1000000 --sleep 0.01 --pid-file $work/slow.pid"); do
    kill -9 "$p"
  done
  wait "$sup"; st=$?
  # the rank sleeps 600 s ignoring SIGTERM: still there 10 s after rk run ended, teardown missed it
  wait_for "[[ -z \"\$(job_procs $work/slow.token)\" ]]" 10
  left=$(job_procs "$work/slow.token")
  [[ $st == 1 && -z $left ]] && ok "teardown killed the rank that never said hello (rk run exit $st)" \
    || bad "rank without hello: rk run exit $st, left: $left: $(grep 'rk run' "$work/slow.out" | tail -2)"
  for p in $left; do kill -9 "$p" 2>/dev/null; done
else
  bad "slow-rank job did not start: $(tail -3 "$work/slow.out")"
fi

# --- (4) a stranger's hello, (5) a flood: before the ranks say hello ----------------------------
# each rank writes RK_HEARTBEAT to a file, then starts once the test says go (its stranger's
# hello or flood sent; 100 s at most, within --startup-timeout)
cat >"$work/late_rank.sh" <<EOF
echo "\$RK_HEARTBEAT" >"$work/sock.\$RANK"
for i in \$(seq 1000); do [ -e "$work/go" ] && break; sleep 0.1; done
exec python3 "$pyw" --steps 100 --sleep 0.01 --result "$work/late.\$RANK.json"
EOF
cat >"$work/stranger.py" <<'PY'
import json, os, socket, sys, time
path, pid, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def conn():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(path); return s
if what == "hello":  # rank 0's hello with another process's pid; until rk run closes it
    s = conn()
    s.sendall((json.dumps({"type": "hello", "v": 1, "rank": 0, "world": 2, "pid": pid,
                           "device": "0", "step": 0}) + "\n").encode())
    s.settimeout(60)
    print("closed by rk run" if s.recv(4096) == b"" else "answered", flush=True)
    s.close()
    sys.exit(0)
s = conn()  # one connection, thousands of bad lines
try:
    for i in range(5000):
        s.sendall(b"{not json\n")
except OSError:
    pass
s.close()
for i in range(300):  # many connections, one bad line each
    s = conn()
    try:
        s.sendall(b'{"type":"step","rank":0,"step":1,"loss":1,"dt":1}\n')
    except OSError:
        pass
    s.close()
for i in range(3000):  # connect/close cycles
    conn().close()
idle = [conn() for i in range(100)]  # open, silent: closed by rk run after a few seconds
print("flood sent", flush=True)
time.sleep(7)  # the flood's length (the job runs meanwhile), not a wait for rk run
print("flood done", flush=True)
PY
# late_job NAME: 2 ranks that start once $work/go exists; socket path in $sock, rk run's pid
# in $sup, output in NAME.out
late_job() {
  rm -f "$work"/sock.* "$work/go"
  "$RK" run -n 2 --quiet --startup-timeout 120 --max-restarts 0 -- bash "$work/late_rank.sh" \
    >"$work/$1.out" 2>&1 &
  sup=$!
  pids+=("$sup")
  sock=
  wait_for "[[ -s $work/sock.0 ]]" 60 && sock=$(cat "$work/sock.0")
}
sleep 600 &
victim=$!
pids+=("$victim")
late_job late
if [[ -n $sock ]]; then
  perm_s=$(stat -c %a "$sock") perm_d=$(stat -c %a "$(dirname "$sock")")
  [[ $perm_s == 600 && $perm_d == 700 ]] && ok "socket $perm_s in a directory $perm_d" \
    || bad "socket mode $perm_s, directory $perm_d"
  python3 "$work/stranger.py" "$sock" "$victim" hello >"$work/stranger.out" 2>&1
  echo "# the stranger: $(cat "$work/stranger.out")"
  touch "$work/go"
  wait "$sup"; st=$?
  [[ $st == 0 && -s $work/late.0.json && -s $work/late.1.json ]] \
    && ok "the job finishes (exit 0) after a stranger's hello for rank 0" \
    || bad "stranger job: exit $st: $(grep 'rk run' "$work/late.out" | tail -4)"
  kill -0 "$victim" 2>/dev/null && ok "the stranger's named pid (a sleep) is alive" \
    || bad "the sleep named in the stranger's hello was killed"
  grep -q "refused a hello for rank 0: it names pid $victim but comes from pid" "$work/late.out" \
    && ok "the stranger's hello is refused, named" || bad "no refusal: $(grep 'rk run' "$work/late.out" | head -5)"
else
  bad "late job did not start: $(tail -3 "$work/late.out")"
fi
rm -f "$work"/late.*.json
late_job flood
if [[ -n $sock ]]; then
  python3 "$work/stranger.py" "$sock" 0 flood >"$work/flood.log" 2>&1 &
  flood=$!
  pids+=("$flood")
  wait_for "grep -q 'flood sent' $work/flood.log" 120 || bad "the flood was not sent within 120 s"
  touch "$work/go"
  wait "$sup"; st=$?
  wait "$flood"
  [[ $st == 0 && -s $work/late.0.json && -s $work/late.1.json ]] \
    && ok "the job finishes (exit 0) through a flood of connections and bad lines" \
    || bad "flood job: exit $st: $(grep 'rk run' "$work/flood.out" | tail -4)"
  lines=$(wc -l <"$work/flood.out")
  [[ $lines -le 40 ]] && ok "rk run's output stays short through the flood ($lines lines)" \
    || bad "rk run's output has $lines lines: $(sort "$work/flood.out" | uniq -c | sort -rn | head -3)"
  grep -q "more messages about heartbeat connections that said no valid hello were suppressed" "$work/flood.out" \
    && ok "... and says how many messages about the flood it did not print" \
    || bad "no count of the suppressed messages: $(grep -c 'hello' "$work/flood.out") lines"
  grep -q "flood done" "$work/flood.log" && ok "the flood ran while the job ran" \
    || bad "flood: $(tail -2 "$work/flood.log")"
else
  bad "flood job did not start: $(tail -3 "$work/flood.out")"
fi

# --- (6) the launcher ---------------------------------------------------------------------
if ! command -v srun >/dev/null; then
  "$RK" run -n 1 --launcher srun --quiet --max-restarts 5 -- true >"$work/srun.out" 2>&1
  st=$?
  [[ $st == 2 && $(grep -c "cannot run the launcher srun" "$work/srun.out") == 1 ]] \
    && ! grep -q relaunch "$work/srun.out" \
    && ok "an unexecutable launcher: one message, exit 2, no relaunch" \
    || bad "srun: exit $st: $(grep 'rk run' "$work/srun.out" | head -4)"
fi
# one node: every listener of the job's processes (mpirun's out-of-band and PMIx ones) on
# loopback, seen by `ss`; with --host, the interface list is left to Open MPI
if command -v ss >/dev/null; then
  "$RK" run -n 2 --launcher mpirun --quiet -- python3 "$pyw" --steps 100000 --sleep 0.01 --result "$work/ss.token" --pid-file "$work/ss.pid" \
    >"$work/ss.out" 2>&1 &
  sup=$!
  pids+=("$sup")
  # a rank has started (its pid file): mpirun's listeners are all open by then
  wait_for "[[ -s $work/ss.pid ]]" 60
  mine=$(job_procs "$work/ss.token" | tr ' ' '|' | sed 's/|$//')
  ss -ltnp | grep -E "pid=($mine)," >"$work/ss.txt"
  kill -TERM "$sup"
  wait "$sup"
  open=$(awk '{print $4}' "$work/ss.txt" | grep -vE '^(127\.0\.0\.1|\[::1\]):' | tr '\n' ' ')
  [[ -s $work/ss.txt && -z $open ]] \
    && ok "a single-node job listens on loopback only: $(awk '{print $4}' "$work/ss.txt" | tr '\n' ' ')" \
    || bad "listeners not on loopback: ${open:-none found}: $(cat "$work/ss.txt")"
fi
# --- (7) two jobs, two Open MPI job ids ---------------------------------------------------------
# Open MPI names a job (its shared memory in /dev/shm and its session directories on every
# host) by the host's name and mpirun's pid; in a fresh PID namespace that pid was always 2,
# so two multi-host jobs started from one host shared one job id and crashed each other in
# MPI_Init. Three jobs in their namespaces: not one id for all three.
cat >"$work/jobid.sh" <<'SH'
#!/bin/sh
[ "$OMPI_COMM_WORLD_RANK" = 0 ] && echo "jobid=$OMPI_MCA_ess_base_jobid"
exit 0
SH
chmod +x "$work/jobid.sh"
ids=()
for i in 1 2 3; do
  "$RK" run -n 2 --launcher mpirun --quiet -- "$work/jobid.sh" >"$work/jobid$i.out" 2>&1
  ids+=("$(sed -n 's/^jobid=\([0-9]*\)$/\1/p' "$work/jobid$i.out")")
done
distinct=$(printf '%s\n' "${ids[@]}" | sort -u | grep -c .)
grep -q "no PID namespace" "$work/jobid1.out" && echo "# no PID namespace here: the ids are the kernel's pids"
[[ -n ${ids[0]} && -n ${ids[1]} && -n ${ids[2]} && $distinct -gt 1 ]] \
  && ok "three mpirun jobs, $distinct Open MPI job ids: ${ids[*]}" \
  || bad "Open MPI job ids of three jobs: '${ids[*]}': $(tail -2 "$work/jobid1.out")"
"$RK" run -n 1 --quiet --launcher-arg --host --launcher-arg localhost -- python3 "$pyw" \
  --steps 5 --sleep 0 >"$work/host.out" 2>&1
grep "mpirun" "$work/host.out" | grep -qv "if_include" && ok "with --host the interfaces are Open MPI's choice" \
  || bad "--host: $(grep mpirun "$work/host.out")"
it_finish
