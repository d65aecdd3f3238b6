#!/usr/bin/env bash
# rk run's stop is bounded, and a broken --predictor is bad input (docs/run.md):
# (1) a worker that says hello, sends steps and never reads its commands (so never hears
#     {"cmd":"stop"}): one SIGTERM to `rk run --stop-grace 2` ends it with exit 130 in about
#     2 s, one line saying the ranks did not stop within the grace, and no process of the job
#     left; --stop-grace 0 tears it down at once;
# (2) `rk run --health sim --predictor F` with F empty or random bytes: exit 2, one line naming
#     F, nothing launched.
# Skips (77) without mpirun or python3.
set -u
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_stop
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none

# job_procs TOKEN: pids of processes whose command line holds TOKEN
job_procs() { pgrep -f -- "$1" | tr '\n' ' '; }

# --- (1) a worker deaf to its commands -------------------------------------------------------
# says hello (the heartbeat protocol, docs/protocol.md), writes DIR/hello.RANK, then sends a
# step every 50 ms forever; never reads the socket, ignores SIGTERM
cat >"$work/deaf.py" <<'PY'
import json, os, signal, socket, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
world = int(os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["RK_HEARTBEAT"])
def send(**m):
    s.sendall((json.dumps(m, separators=(",", ":")) + "\n").encode())
send(type="hello", v=1, rank=rank, world=world, pid=os.getpid(), device=str(rank), step=0)
open(os.path.join(sys.argv[1], f"hello.{rank}"), "w").close()
step = 0
while True:
    step += 1
    send(type="step", rank=rank, step=step, loss=1.0, dt=0.05)
    time.sleep(0.05)
PY
# deaf_case NAME GRACE LO HI: 2 deaf ranks; SIGTERM rk run once both said hello: exit 130
# within [LO, HI] ms, the grace's line, nothing of the job left
deaf_case() {
  local name=$1 grace=$2 lo=$3 hi=$4
  local d="$work/$name"
  mkdir -p "$d"
  "$RK" run -n 2 --quiet --health off --stop-grace "$grace" -- python3 "$work/deaf.py" "$d" \
    >"$d/out" 2>&1 &
  local sup=$!
  pids+=("$sup")
  if ! wait_for "[[ -e $d/hello.0 && -e $d/hello.1 ]]" 60; then
    bad "$name: the ranks did not say hello within 60 s: $(tail -3 "$d/out")"; return
  fi
  # (the grace runs from the signal, whether or not rk run has read the hellos yet: a rank
  # that says hello after the stop went out gets it at once)
  local t0; t0=$(date +%s%N)
  kill -TERM "$sup"
  if ! wait_for "! kill -0 $sup 2>/dev/null" 10; then
    bad "$name: rk run still running 10 s after SIGTERM (--stop-grace $grace): $(tail -2 "$d/out")"
    kill -9 "$sup" 2>/dev/null
  fi
  wait "$sup" 2>/dev/null
  local st=$?
  local took=$((($(date +%s%N) - t0) / 1000000))
  wait_for "[[ -z \"\$(job_procs $d)\" ]]" 3
  local left; left=$(job_procs "$d")
  [[ $st == 130 ]] && ((took >= lo && took <= hi)) \
    && ok "$name: one SIGTERM, rk run exit 130 after $took ms (--stop-grace $grace)" \
    || bad "$name: rk run exit $st after $took ms, wanted 130 within [$lo, $hi] ms: $(tail -3 "$d/out")"
  [[ -z $left ]] && ok "$name: nothing of the job is left" \
    || bad "$name: still running after rk run exited: $left"
  for p in $left; do kill -9 "$p" 2>/dev/null; done
  if [[ $grace == 0 ]]; then
    grep -q "tearing the job down at once (--stop-grace 0)" "$d/out" \
      && ok "$name: says it tears the job down at once" || bad "$name: $(tail -3 "$d/out")"
  else
    [[ $(grep -c "the ranks did not stop within --stop-grace $grace s" "$d/out") == 1 ]] \
      && ok "$name: one line says the ranks did not stop within the grace" \
      || bad "$name: no line about the grace: $(tail -3 "$d/out")"
  fi
}
deaf_case grace2 2 1500 8000
deaf_case grace0 0 0 4000

# --- (2) a broken --predictor ---------------------------------------------------------------
: >"$work/empty.model"
head -c 4096 /dev/urandom >"$work/random.model"
for f in empty random; do
  m="$work/$f.model"
  "$RK" run -n 1 --quiet --health sim --predictor "$m" -- \
    touch "$work/$f.ran" >"$work/$f.out" 2>&1
  st=$?
  [[ $st == 2 ]] && grep -q "health gate: $m" "$work/$f.out" && [[ ! -e $work/$f.ran ]] \
    && ok "--predictor with $f bytes: exit 2 naming the file, nothing launched" \
    || bad "--predictor with $f bytes: exit $st: $(head -2 "$work/$f.out")"
done
it_finish
