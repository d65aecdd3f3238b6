#!/usr/bin/env bash
# What a rank said before another rank failed is kept, whatever order rk run reads it in.
# Two ranks under mpirun, written from docs/protocol.md alone: rank 0
# says an in-process event (a replica mismatch it rolled back), then rank 1 says it exits
# (commfail) and exits 3. rk run is stopped (SIGSTOP) while they speak and resumed once both
# have spoken, so it reads both at once, rank 1's first (it connected first): the event of rank 0 must still be in --events, beside the
# commfail's relaunch, and the job ends (exit 0) after the relaunch. A busy machine did this
# to it_memrecover: the replica mismatch read after the commfail was dropped.
# Needs python3 and mpirun.
set -u
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_late_words
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none

cat >"$work/rank.py" <<'PY'
# argv: LOGDIR. Launch 0: rank 1 connects first; both wait for LOGDIR/go; rank 0 says a
# replica_mismatch (rollback) and marks LOGDIR/event.0, then rank 1 says commfail (exit),
# marks LOGDIR/said.1 and exits 3. Later launches:
# 3 steps, bye done.
import json, os, socket, sys, time
log = sys.argv[1]
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
launch = os.environ.get("RK_LAUNCH", "0")
def wait(name):
    while not os.path.exists(os.path.join(log, name)):
        time.sleep(0.01)
def mark(name):
    open(os.path.join(log, name), "w").close()
if launch == "0" and rank == 0:
    wait("hello.1")
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ["RK_HEARTBEAT"])
def send(**m):
    sock.sendall((json.dumps(m, separators=(",", ":")) + "\n").encode())
send(type="hello", v=1, rank=rank, world=world, pid=os.getpid(), device="", step=0)
if launch != "0":
    for s in range(1, 4):
        send(type="step", rank=rank, step=s, loss=1.0, dt=0.01)
    send(type="bye", rank=rank, step=3, status="done")
    sys.exit(0)
mark(f"hello.{rank}")
wait("go")
if rank == 0:
    send(type="event", rank=0, step=5, kind="replica_mismatch", blame=-1, action="rollback",
         lost_steps=0, detail="the replicas of 2 ranks differ with no majority (test)")
    mark("event.0")
    sock.recv(1)  # until the job is torn down
    sys.exit(1)
wait("event.0")
send(type="event", rank=1, step=7, kind="commfail", blame=1, action="exit", lost_steps=0,
     detail="step 7: injected communication failure (test)")
mark("said.1")
sys.exit(3)
PY

RK_TRACE_LAUNCH="$work/trace" "$RK" run -n 2 --launcher mpirun --heartbeat-timeout 30 --events "$work/ev.jsonl" \
  -- python3 "$work/rank.py" "$work" >"$work/run.out" 2>&1 &
sup=$!
atexit+=("kill -CONT $sup 2>/dev/null; kill $sup 2>/dev/null")
# both hellos read and believed by rk run (its sup.hello trace lines), not only sent: a hello
# read after its rank was gone cannot be checked against the launch's processes, and is refused
# with what follows it (on a busy machine rk run was stopped before it had read them)
if wait_for "[[ -e $work/hello.0 && -e $work/hello.1 && \$(grep -c '^sup.hello ' $work/trace 2>/dev/null) == 2 ]]" 60; then
  kill -STOP "$sup"
  # stopped for sure before the ranks speak: its state is T
  wait_for "[[ \$(awk '{print \$3}' /proc/$sup/stat) == T ]]" 10
  touch "$work/go"
  # both have spoken (their words are in rk run's sockets)
  wait_for "[[ -e $work/event.0 && -e $work/said.1 ]]" 60 || bad "the ranks did not speak"
  kill -CONT "$sup"
  wait "$sup"
  st=$?
  [[ $st == 0 ]] && ok "the job ends after the relaunch (exit 0)" ||
    bad "rk run exit $st: $(tail -4 "$work/run.out")"
  python3 - "$work/ev.jsonl" <<'PY' && ok "rank 0's replica mismatch, read after rank 1's exit, is in the events beside the commfail's relaunch" || bad "events: $(cut -c1-160 "$work/ev.jsonl")"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
kinds = [(e["kind"], e["action"]) for e in ev]
assert ("replica_mismatch", "rollback") in kinds, kinds
assert ("commfail", "relaunch") in kinds, kinds
PY
else
  bad "the ranks never said hello: $(tail -4 "$work/run.out")"
fi
it_finish
