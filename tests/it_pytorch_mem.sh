#!/usr/bin/env bash
# Relaunch from memory for PyTorch jobs (docs/recovery.md, "Relaunch from memory": PyTorch):
# 2 and 4 ranks of the PyTorch example (gloo on CPU) under `rk run --launcher local` through
# a NaN, a crash, a bit flip in one replica, a hang, a communication failure and a SIGKILL sent
# to one rank by its pid (found in rk run's process tree) end with the fault-free run's
# parameters, bit for bit, and every relaunch incident says it resumed from node memory with
# at most the step in flight lost (snapshots every step); with --recovery disk (2 ranks) the
# same faults but the hang end with the same parameters and the relaunches name the disk. A
# tmpfs too small for two generations gives one snapshot_off event, disk only, the fault-free
# parameters. The checkpoints rk run writes from the snapshots (RK_CKPT_FROM_SNAP) hold what
# the ranks' own would; a full disk under them stops the job as a storage error.
# Skips (77) without a python3 that has torch, numpy and xxhash, or without Fashion-MNIST.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
py=$("$RK_SRC/tests/pyfind.sh" torch xxhash numpy) || { echo "$py"; exit 77; }
it_need_data
it_init it_pytorch_mem
cd "$work" || exit 1
steps=48
ex=("$py" "$RK_SRC/examples/pytorch/train_fashion_mnist.py" --subset 1024 --batch 32 --hash-every 5
    --ckpt-every 20 --steps "$steps" --data "$DATA")
# snapshots every step (RK_SNAP_EVERY: not timed, so the test does not depend on the machine's
# speed): memory is as new as the step in flight at every fault
export RK_SNAP_EVERY=1

# sup NAME N [rk run flags...]: N ranks under rk run; NAME.log, NAME.events, NAME.json
sup() {
  local name=$1 n=$2; shift 2
  "$RK" run -n "$n" --launcher local --heartbeat-timeout 5 --startup-timeout 300 --failure-threshold 100 \
    --ckpt-dir "$work/$name.ck" --events "$work/$name.events" "$@" \
    -- "${ex[@]}" --result "$work/$name.json" >"$work/$name.log" 2>&1
}

# snapdir NAME: the snapshot directory rk run named in its status line ("" if none)
snapdir() { sed -n 's/.*recovery from memory: the ranks.* snapshots in \([^ ]*\) .*/\1/p' "$work/$1.log" | head -1; }

# newest NAME: the newest step rank 0 holds, in memory (a run with a snapshot directory) or on
# disk; -1 if none yet
newest() {
  local d
  d=$(snapdir "$1")
  if [[ -n $d ]]; then
    ls "$d/rank-0" 2>/dev/null | sed -n 's/^snap-0*\([0-9][0-9]*\)\.safetensors$/\1/p' | sort -n | tail -1
  else
    sed -n 's/^ckpt-0*\([0-9][0-9]*\)\.safetensors$/\1/p' "$work/$1.ck/latest" 2>/dev/null
  fi | grep . || echo -1
}

# faulty NAME N SPEC [rk run flags...]: the run with SPEC's faults, and a SIGKILL to the last
# rank by its pid once rank 0 holds step 40 (in memory, or on disk for --recovery disk)
faulty() {
  local name=$1 n=$2 spec=$3 victim="" at=-1 sp st
  shift 3
  sup "$name" "$n" --inject "$spec" "$@" &
  sp=$!
  pids+=("$sp")
  # the victim, SIGKILLed once step 40 is held in memory (the signal: the snapshot file)
  kill_held() {
    at=$(newest "$name")
    ((at >= 40)) || return 1
    victim=$(rank_pid "$sp" "$((n - 1))" train_fashion_mnist.py) && kill -9 "$victim" && return 0
    victim=""
    return 1
  }
  wait_for 'kill_held || ! kill -0 "$sp" 2>/dev/null' 300
  [[ -n $victim ]] && ok "$name: SIGKILL to rank $((n - 1)) (pid $victim) with step $at held" \
    || bad "$name: no rank $((n - 1)) to kill once step 40 was held"
  wait "$sp"
  st=$?
  [[ $st == 0 ]] && ok "$name: the job with its faults finishes" || bad "$name: exit $st: $(tail -8 "$work/$name.log")"
}

# events NAME SOURCE N KINDS: every relaunch incident resumed from SOURCE (a regular
# expression), at least N of them; an event of each of KINDS (comma-separated) is there
events() {
  it_count "$py" - "$work/$1.events" "$2" "$3" "$4" <<'PY'
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
for k in sys.argv[4].split(","):
    check(k in kinds, f"an event of kind {k}")
check(not any(e["kind"] == "snapshot_off" for e in ev), "no snapshot_off event")
PY
}

for n in 2 4; do
  last=$((n - 1))
  # rank 0 takes 1 s more a step from step 36 (the weights do not change): time to find the
  # victim's pid once step 40 is held, before every rank has said bye (a kill after that ends
  # nothing: at a load of ~27 on 2 cores, 200 ms a step was too little and the 4-rank run's
  # SIGKILL landed after the end, with no relaunch to count)
  spec="nan@step=6:rank=0,crash@step=10:rank=1,bitflip@step=13:rank=$last,hang@step=22:rank=1"
  spec+=",commfail@step=30:rank=$last,slow@step=36:rank=0:ms=1000"
  if sup ref$n "$n" --recovery disk; then ok "$n ranks: fault-free run finishes"
  else bad "$n ranks: fault-free run: exit $?: $(tail -5 "$work/ref$n.log")"; continue; fi
  ref=$(json "ref$n.json" hash)

  faulty mem$n "$n" "$spec"
  h=$(json "mem$n.json" hash 2>/dev/null)
  [[ -n $h && $h == "$ref" ]] && ok "$n ranks, memory: parameters hash $h equals the fault-free run's" \
    || bad "$n ranks, memory: parameters hash '$h' differs from the fault-free $ref"
  events mem$n "node memory" 4 crash,hang,commfail,nan,replica_mismatch # 4: and the SIGKILL
  d=$(snapdir mem$n)
  [[ -n $d && ! -e $d ]] && ok "$n ranks, memory: its snapshot directory $d was removed at the end" \
    || bad "$n ranks, memory: snapshot directory '$d' left behind or never made"

  # disk: today's path (it_pytorch_ranks runs it at 4 ranks with every fault), named here; at 2
  # ranks, without the hang (the test's time)
  ((n == 2)) || continue
  faulty disk$n "$n" "${spec/,hang@step=22:rank=1/}" --recovery disk
  h=$(json "disk$n.json" hash 2>/dev/null)
  [[ -n $h && $h == "$ref" ]] && ok "$n ranks, disk: parameters hash $h equals the fault-free run's" \
    || bad "$n ranks, disk: parameters hash '$h' differs from the fault-free $ref"
  # the crash at step 10 comes before the first checkpoint (step 20): a fresh start
  events disk$n 'disk checkpoint|nothing \(a fresh start\)' 3 crash,commfail,nan,replica_mismatch
done

# --- the disk checkpoints rk run writes from the snapshots (RK_CKPT_FROM_SNAP) are rank 0's ----
# the fault-free run with snapshots: rk run writes its checkpoints (said once), the last one
# always; each one holds the items of ref2's (the ranks wrote those: --recovery disk) in the same order, with the same
# metadata and the same bytes, but the unseeded `random` and `numpy` generators' states, which
# differ from any run to the next
if sup snap2 2; then ok "2 ranks, checkpoints from the snapshots: fault-free run finishes"
else bad "2 ranks, checkpoints from the snapshots: exit $?: $(tail -5 "$work/snap2.log")"; fi
grep -q "written from the ranks' snapshots" "$work/snap2.log" \
  && ok "snap2: rk run wrote the checkpoints from the snapshots" \
  || bad "snap2: rk run never said it wrote a checkpoint from the snapshots: $(grep 'rk run' "$work/snap2.log" | tail -4)"
[[ $(json snap2.json hash 2>/dev/null) == "$(json ref2.json hash)" ]] \
  && ok "snap2: parameters hash equals the fault-free run's" || bad "snap2: parameters hash differs"
it_count env PYTHONPATH="$RK_SRC/python" "$py" - "$work/snap2.ck" "$work/ref2.ck" <<'PY'
import os, re, sys
from rekindle import ckpt
a, b = sys.argv[1:3]
names = lambda d: {f for f in os.listdir(d) if re.fullmatch(r"ckpt-[0-9]+\.safetensors", f)}
# a checkpoint asked for while the disk still wrote the one before may be superseded by a newer
# one (docs/recovery.md): the last one is always written
steps = sorted(names(a) & names(b))
last = max(names(b))
print(("ok - " if last in names(a) else "FAIL - ") + f"the last checkpoint {last} was written from the snapshots "
      f"(of {sorted(names(b))}: {sorted(names(a))})")
for f in steps:
    x, y = ckpt.load(os.path.join(a, f)), ckpt.load(os.path.join(b, f))
    same = list(x.items) == list(y.items)
    print(("ok - " if same else "FAIL - ") + f"{f}: the same {len(x.items)} items in the same order"
          + ("" if same else f" ({list(x.items)} against {list(y.items)})"))
    fields = [(c.step, c.epoch, c.cursor, c.world_size, c.config) for c in (x, y)]
    print(("ok - " if fields[0] == fields[1] else "FAIL - ") + f"{f}: the same metadata {fields[0]}")
    diff = [n for n in y.items if not re.match(r"rng\.(random|numpy)", n)
            and (x.items[n].dtype, x.items[n].shape, bytes(x.items[n].data)) !=
            (y.items[n].dtype, y.items[n].shape, bytes(y.items[n].data))]
    print(("ok - " if not diff else "FAIL - ") + f"{f}: every item's bytes equal" + (f" but {diff}" if diff else ""))
PY

# --- a tmpfs too small for two generations: one snapshot_off, disk only, the job finishes ----
small="$work/small"
mkdir -p "$small"
if unshare -m true 2>/dev/null; then
  unshare -m bash -c 'mount -t tmpfs -o size=1m,mode=0755 tmpfs "$1" && shift && RK_SNAP_PARENT=$0 "$@"' \
    "$small" "$small" "$RK" run -n 2 --launcher local --heartbeat-timeout 5 --startup-timeout 300 \
    --ckpt-dir "$work/small.ck" --events "$work/small.events" --inject crash@step=30:rank=1 \
    -- "${ex[@]}" --result "$work/small.json" >"$work/small.log" 2>&1
  st=$?
  [[ $st == 0 ]] && ok "tiny tmpfs: the job finishes" || bad "tiny tmpfs: exit $st: $(tail -8 "$work/small.log")"
  h=$(json small.json hash 2>/dev/null)
  [[ -n $h && $h == "$(json ref2.json hash)" ]] && ok "tiny tmpfs: parameters hash $h equals the fault-free run's" \
    || bad "tiny tmpfs: parameters hash '$h'"
  it_count "$py" "$RK_SRC/tests/snapoff_check.py" "$work/small.events"
else
  echo "(no mount namespace here: the tiny tmpfs case is not run)"
fi

# --- rk run cannot write a checkpoint from the snapshots: a full disk stops the job -----------
# (a storage stop, as when rank 0 cannot write: exit 1, one storage incident, no device blamed,
# no relaunch), whether the job is still running (a checkpoint at step 20, the steps after it
# slowed) or already done (only the last step's checkpoint)
full="$work/full"
mkdir -p "$full"
for kind in running done; do
  if ! unshare -m true 2>/dev/null; then echo "(no mount namespace here: the full-disk cases are not run)"; break; fi
  extra=(--ckpt-every 20) inj=(--inject slow@step=21:rank=0:ms=100)
  [[ $kind == done ]] && extra=(--ckpt-every 1000) inj=()
  unshare -m bash -c 'mount -t tmpfs -o size=64k,mode=0755 tmpfs "$0" && "$@"' "$full" \
    "$RK" run -n 2 --launcher local --heartbeat-timeout 5 --startup-timeout 300 --failure-threshold 1 \
    --ckpt-dir "$full/ck" --events "$work/full_$kind.events" --summary-json "$work/full_$kind.sum" "${inj[@]}" \
    -- "${ex[@]}" "${extra[@]}" >"$work/full_$kind.log" 2>&1
  st=$?
  [[ $st == 1 ]] && ok "full disk, job $kind: rk run exits 1" || bad "full disk, job $kind: exit $st: $(tail -5 "$work/full_$kind.log")"
  grep -q "storage error on the checkpoint directory $full/ck: .*No space left on device" "$work/full_$kind.log" \
    && ok "full disk, job $kind: one line names the directory and the full disk" \
    || bad "full disk, job $kind: no storage line: $(grep 'rk run' "$work/full_$kind.log" | tail -4)"
  first=20
  [[ $kind == done ]] && first=48
  it_count "$py" - "$work/full_$kind.events" "$work/full_$kind.sum" "$first" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
ev = [e for e in ev if e["kind"] not in ("snapshot_on", "snapshot_held", "snapshot_peak", "inject")]
s = json.load(open(sys.argv[2]))
ok = [(e["kind"], e["action"], e["device"]) for e in ev] == [("storage", "stop", None)]
ok = ok and f"checkpoint of step {sys.argv[3]} " in ev[0]["detail"]
print(("ok - " if ok else "FAIL - ") + f"one storage incident (stop), no device, naming the checkpoint of step "
      f"{sys.argv[3]}: {[(e['kind'], e['detail']) for e in ev]}")
ok = s["incidents"] == {"storage": 1} and s["restarts"] == 0 and s["quarantined"] == 0 and s["outcome"] == "failed"
print(("ok - " if ok else "FAIL - ") + f"summary: {s['incidents']}, {s['restarts']} restarts, outcome {s['outcome']}")
PY
done

it_finish
