#!/usr/bin/env bash
# Relaunch from memory (docs/recovery.md), with real Open MPI ranks of `rk train`: at 2 and 4
# ranks, a crash, a NaN, a hang, a bit flip in one replica, a communication failure and a
# SIGKILL sent to one rank by its pid (from rk run's process tree) end with the fault-free
# run's weights_xxh64, and every relaunch incident says it resumed from node memory, having
# lost at most the step in flight (snapshots every step); with
# --recovery disk the same faults end with the same weights and the relaunches name the disk
# checkpoint; a tmpfs too small for two generations (RK_SNAP_PARENT on a 1 MiB tmpfs in this
# test's own mount namespace) gives exactly one snapshot_off event and the job still finishes
# with the fault-free weights. No snapshot directory outlives its rk run. Skips (77) without
# mpirun or data.
set -u
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_need_data
it_init it_memrecover
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none

python3 "$RK_SRC/tests/make_subset.py" "$DATA" "$work/sub" 3200 500 || { bad "make subset"; exit 1; }
steps=130
# checkpoints on disk every 40 steps, snapshots every step (RK_SNAP_EVERY: not timed, so the
# test does not depend on the machine's speed): memory is newer than disk at every fault
worker=("$RK" train --model mlp --data "$work/sub" --threads 1 --seed 3 --max-steps "$steps"
        --epochs 3 --no-eval --ckpt-every 40)
export RK_SNAP_EVERY=1

# sup NAME N [rk run flags...]: N ranks under rk run; NAME.out, NAME.events, NAME.json
sup() {
  local name=$1 n=$2; shift 2
  "$RK" run -n "$n" --ckpt-dir "$work/$name.ck" --heartbeat-timeout 3 --failure-threshold 9 \
    --events "$work/$name.events" "$@" \
    -- "${worker[@]}" --metrics-json "$work/$name.json" >"$work/$name.out" 2>&1
}

# snapdir NAME: the snapshot directory rk run named in its status line ("" if none)
snapdir() { sed -n 's/.*recovery from memory: the ranks.* snapshots in \([^ ]*\) .*/\1/p' "$work/$1.out" | head -1; }

# gone NAME: the run's snapshot directory no longer exists
gone() {
  local d
  d=$(snapdir "$1")
  [[ -n $d && ! -e $d ]] && ok "$1: its snapshot directory $d was removed at the end" \
    || bad "$1: snapshot directory '$d' left behind or never made"
}

# events NAME SOURCE N: every relaunch incident resumed from SOURCE (a regular expression), at
# least N of them; the in-process ones (nan, replica_mismatch) are there too
events() {
  it_count python3 - "$work/$1.events" "$2" "$3" <<'PY'
import json, re, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
source, want = sys.argv[2], int(sys.argv[3])
def check(c, msg):
    print(("ok - " if c else "FAIL - ") + msg + ("" if c else f" (events: {[(e['kind'], e['action'], e['detail']) for e in ev]})"))
rel = [e for e in ev if e["action"] == "relaunch"]
check(len(rel) >= want, f"{len(rel)} relaunch incidents, at least {want}")
for e in rel:
    check(re.search(f"; resumed from ({source}) at step [0-9]+$", e["detail"]),
          f"{e['kind']} of rank {e['rank']}: '...{e['detail'][-48:]}'")
    if source == "node memory":  # every step is snapshotted: at most the step in flight is lost
        check(0 <= e["lost_steps"] <= 1, f"{e['kind']}: {e['lost_steps']} steps lost, at most 1")
kinds = {e["kind"] for e in ev}
for k in ("crash", "hang", "commfail", "nan", "replica_mismatch"):
    check(k in kinds, f"an event of kind {k}")
check(not any(e["kind"] == "snapshot_off" for e in ev), "no snapshot_off event")
PY
}

for n in 2 4; do
  last=$((n - 1))
  spec="crash@step=20:rank=1,nan@step=30:rank=0,hang@step=45:rank=1,bitflip@step=60:rank=$last"
  spec+=",commfail@step=75:rank=$last"
  # from step 90 rank 0 takes 100 ms more a step (the weights do not change): time to find
  # the victim's pid before the job ends
  slow=",slow@step=90:rank=0:ms=100"
  # --- the fault-free reference (disk only) -------------------------------------------------
  if sup ref$n "$n" --recovery disk; then ok "$n ranks: fault-free run finishes"
  else bad "$n ranks: fault-free run: exit $?: $(tail -5 "$work/ref$n.out")"; continue; fi
  ref=$(json "$work/ref$n.json" weights_xxh64)

  # --- memory: the faults, then a SIGKILL by pid once the victim holds step 95 --------------
  sup mem$n "$n" --inject "$spec$slow" &
  sp=$!
  pids+=("$sp")
  victim="" at=""
  # the victim, SIGKILLed once its rank holds step 95 in memory (the signal: the snapshot file)
  kill_held() {
    local d
    d=$(snapdir mem$n)
    [[ -n $d ]] && ls "$d/rank-$last" 2>/dev/null | grep -Eq '^snap-0*(9[5-9]|1[0-9][0-9])\.safetensors$' \
      || return 1
    at=$(ls "$d/rank-$last" | sed -n 's/^snap-0*\([0-9]*\)\.safetensors$/\1/p' | sort -n | tail -1)
    victim=$(rank_pid "$sp" "$last" train 2>/dev/null) && kill -9 "$victim" && return 0
    victim=""
    return 1
  }
  wait_for 'kill_held || ! kill -0 "$sp" 2>/dev/null' 300
  [[ -n $victim ]] && ok "$n ranks: SIGKILL to rank $last (pid $victim) with step $at in memory" \
    || bad "$n ranks: no rank $last to kill after step 95 was snapshotted"
  wait "$sp"
  st=$?
  [[ $st == 0 ]] && ok "$n ranks, memory: the job with 6 faults and a SIGKILL finishes" \
    || bad "$n ranks, memory: exit $st: $(tail -8 "$work/mem$n.out")"
  h=$(json "$work/mem$n.json" weights_xxh64 2>/dev/null)
  [[ -n $h && $h == "$ref" ]] && ok "$n ranks, memory: weights_xxh64 $h equals the fault-free run's" \
    || bad "$n ranks, memory: weights_xxh64 '$h' differs from the fault-free $ref"
  events mem$n "node memory" 4  # crash, hang, commfail, the SIGKILL (2 ranks: the flip too)
  grep -q "resumed from node memory at step" "$work/mem$n.out" \
    && ok "$n ranks, memory: the status line says where the ranks resumed from" \
    || bad "$n ranks, memory: no 'resumed from node memory' status line"
  gone mem$n

  # --- disk: the same faults --------------------------------------------------------------
  if sup disk$n "$n" --recovery disk --inject "$spec"; then ok "$n ranks, disk: the job with 5 faults finishes"
  else bad "$n ranks, disk: exit $?: $(tail -8 "$work/disk$n.out")"; fi
  h=$(json "$work/disk$n.json" weights_xxh64 2>/dev/null)
  [[ -n $h && $h == "$ref" ]] && ok "$n ranks, disk: weights_xxh64 $h equals the fault-free run's" \
    || bad "$n ranks, disk: weights_xxh64 '$h' differs from the fault-free $ref"
  # the crash at step 20 comes before the first checkpoint (step 40): a fresh start
  events disk$n 'disk checkpoint|nothing \(a fresh start\)' 3
  [[ -z $(snapdir disk$n) ]] && ok "$n ranks, disk: no snapshot directory made" \
    || bad "$n ranks, disk: a snapshot directory was made"
done

# --- ranks that may run on other hosts: said once, disk only ---------------------------------
"$RK" run -n 2 --ckpt-dir "$work/hosts.ck" --launcher mpirun --launcher-arg -H \
  --launcher-arg localhost:2 -- true >"$work/hosts.out" 2>&1
n=$(grep -c "recovery from memory is not built yet for ranks on several hosts (the launcher arguments name hosts)" "$work/hosts.out")
[[ $n == 1 && -z $(snapdir hosts) ]] \
  && ok "launcher arguments that name hosts: one status line says memory recovery is not built there, no directory" \
  || bad "hosts: $n status lines, directory '$(snapdir hosts)': $(head -5 "$work/hosts.out")"

# --- a tmpfs too small for two generations: one snapshot_off, disk only, the job finishes ----
small="$work/small"
mkdir -p "$small"
if unshare -m true 2>/dev/null; then
  unshare -m bash -c 'mount -t tmpfs -o size=1m,mode=0755 tmpfs "$1" && shift && RK_SNAP_PARENT=$0 "$@"' \
    "$small" "$small" "$RK" run -n 2 --ckpt-dir "$work/small.ck" --heartbeat-timeout 3 \
    --events "$work/small.events" --inject crash@step=50:rank=1 \
    -- "${worker[@]}" --metrics-json "$work/small.json" >"$work/small.out" 2>&1
  st=$?
  [[ $st == 0 ]] && ok "tiny tmpfs: the job finishes" || bad "tiny tmpfs: exit $st: $(tail -8 "$work/small.out")"
  h=$(json "$work/small.json" weights_xxh64 2>/dev/null)
  [[ -n $h && $h == "$(json "$work/ref2.json" weights_xxh64)" ]] \
    && ok "tiny tmpfs: weights_xxh64 $h equals the fault-free run's" || bad "tiny tmpfs: weights '$h'"
  it_count python3 "$RK_SRC/tests/snapoff_check.py" "$work/small.events"
else
  echo "(no mount namespace here: the tiny tmpfs case is not run)"
fi

it_finish
