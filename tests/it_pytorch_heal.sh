#!/usr/bin/env bash
# Recovery in place heals from the survivors (docs/recovery.md, "Healed from the ranks kept"):
# a PyTorch job as people write them (tests/pt_heal_job.py: dropout drawing the torch RNG every
# step with a seed per rank, AdamW, BatchNorm whose buffers DDP broadcasts at each forward, a
# scheduler the loop steps after every job.step()) under `rk run --recovery inplace`:
# - rank 1 crashes, exits with a communication failure, hangs: each time the ranks kept keep
#   their state (no rollback: "step N -> N"), the replacement takes it from rank 0 and its own
#   RNG states from its slot, the incident says it healed with no step lost, and the final
#   parameters and learning rate are the fault-free run's, bit for bit;
# - rank 0 crashes twice: healed from rank 1, with rank 0's own BatchNorm buffers (which DDP
#   broadcasts at each forward: no survivor holds them) from its slot; the slot was written
#   before the attempt's copy of the buffers was taken (the previous step's), and the run
#   ended with other weights;
# - the loop draws numpy's global RNG every step (--np-draws): seen at the snapshot puts (said),
#   from then on each attempt saves numpy's and Python's states too (a redo puts them back, the
#   slot holds them): rank 1's crash and rank 0's heal, the fault-free parameters (before, the
#   heal was refused for such a loop and the snapshot restored);
# - RK_HEAL=0: every rank restores the node's snapshot, the fault-free parameters;
# - 4 ranks, a crash of rank 2 and a hang of rank 3: healed, the 4-rank fault-free parameters.
# Before the buffers' broadcast was guarded, the first death raised out of the forward and
# the job was relaunched; before the heal, every replacement rolled back to the snapshot.
# Skips (77) without a python3 that has torch, numpy and xxhash.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
py=$("$RK_SRC/tests/pyfind.sh" torch xxhash numpy) || { echo "$py"; exit 77; }
it_init it_pytorch_heal
cd "$work" || exit 1
job=("$py" "$RK_SRC/tests/pt_heal_job.py" --steps 40 --batch 32 --ckpt-every 20)

# sup NAME N [rk run flags...] [-- job flags]: N ranks under rk run; NAME.log, NAME.events, NAME.json
sup() {
  local name=$1 n=$2; shift 2
  local flags=() extra=()
  while (($#)); do
    [[ $1 == -- ]] && { shift; extra=("$@"); break; }
    flags+=("$1"); shift
  done
  "$RK" run -n "$n" --launcher local --heartbeat-timeout 5 --startup-timeout 300 --failure-threshold 100 \
    --ckpt-dir "$work/$name.ck" --events "$work/$name.events" "${flags[@]}" \
    -- "${job[@]}" "${extra[@]}" --result "$work/$name.json" >"$work/$name.log" 2>&1
}
# check NAME REF WHAT: the run finished, with REF's parameters and rate, and no relaunch
check() {
  local name=$1 ref=$2 what=$3 st=$4 # st: rk run's exit status
  [[ $st == 0 ]] && ok "$what: the job finishes" || bad "$what: exit $st: $(tail -8 "$work/$name.log")"
  local h w
  h=$(cat "$work/$name.json" 2>/dev/null) w=$(cat "$work/$ref.json" 2>/dev/null)
  [[ -n $h && $h == "$w" ]] && ok "$what: parameters and learning rate $h are the fault-free run's" \
    || bad "$what: '$h' differs from the fault-free '$w'"
  grep -q "0 restarts" "$work/$name.log" && ok "$what: no relaunch" \
    || bad "$what: a relaunch: $(grep -E 'restart|exits at' "$work/$name.log" | head -3)"
}
# incidents NAME HOW N: N in_place incidents, each healed (HOW=healed: no step lost) or
# restored from the node's snapshot (HOW=memory)
incidents() {
  it_count "$py" - "$work/$1.events" "$2" "$3" "$4" <<'PY'
import json, re, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
how, n, what = sys.argv[2], int(sys.argv[3]), sys.argv[4]
inp = [e for e in ev if e["action"] == "in_place"]
def check(c, msg):
    print(("ok - " if c else "FAIL - ") + f"{what}: {msg}" +
          ("" if c else f" (events: {[(e['kind'], e['action'], e['detail'][-160:]) for e in ev]})"))
check(len(inp) == n, f"{len(inp)} in-place incidents, want {n}")
for e in inp:
    if how == "healed":
        check(re.search(r"; healed at step [0-9]+: the ranks kept their state in memory and the replacement took "
                        r"theirs \(only the step in flight lost\)$", e["detail"]), f"{e['kind']}: '...{e['detail'][-120:]}'")
        check(e["lost_steps"] == 0, f"{e['kind']}: {e['lost_steps']} steps lost (no step done was lost)")
    else:
        check(re.search(r"resumed from node memory at step [0-9]+$", e["detail"]),
              f"{e['kind']}: '...{e['detail'][-90:]}'")
    check(e.get("recovery_s") is not None, f"{e['kind']}: recovered in {e.get('recovery_s')} s")
check(not [e for e in ev if e["action"] == "relaunch"], "no relaunch incident")
PY
}

n=2
sup ref 2 --recovery disk
st=$?
[[ $st == 0 ]] && ok "fault-free run finishes" || { bad "fault-free run: exit $st: $(tail -5 "$work/ref.log")"; it_finish; exit; }

sup heal 2 --recovery inplace --inject "crash@step=10:rank=1,commfail@step=19:rank=1,hang@step=27:rank=1"
check heal ref "rank 1 thrice" $?
incidents heal healed 3 "rank 1 thrice"
kept=$(grep -c "rank 0: rejoined in place .*: step \([0-9]*\) -> \1, kept its state, the replacement took rank 0's" "$work/heal.log")
[[ $kept == 3 ]] && ok "rank 1 thrice: rank 0 kept its state each time (no rollback)" \
  || bad "rank 1 thrice: $kept of 3 heals: $(grep -E 'rejoined|not healed' "$work/heal.log")"

sup r0 2 --recovery inplace --inject "crash@step=10:rank=0,crash@step=25:rank=0"
check r0 ref "rank 0 twice" $?
incidents r0 healed 2 "rank 0 twice"

sup nref 2 --recovery disk -- --np-draws
sup npr 2 --recovery inplace --inject "crash@step=10:rank=1,crash@step=17:rank=0" -- --np-draws
check npr nref "numpy draws" $?
incidents npr healed 2 "numpy draws"
n=$(grep -c "numpy's or Python's global RNG was drawn from between steps [0-9]* and [0-9]*: each step attempt saves them" \
  "$work/npr.log")
((n >= 2)) && ok "numpy draws: both ranks say their attempts save numpy's and Python's states ($n lines)" \
  || bad "numpy draws: $n lines say so: $(grep -i numpy "$work/npr.log" | head -3)"

# RK_HEAL=0: every rank restores the node's snapshot (the path of a heal that cannot be)
RK_HEAL=0 sup nh 2 --recovery inplace --inject "crash@step=10:rank=1,crash@step=23:rank=0"
check nh ref "RK_HEAL=0" $?
incidents nh memory 2 "RK_HEAL=0"
grep -q "not healed from the ranks kept (RK_HEAL=0): every rank restores the node's snapshot" "$work/nh.log" \
  && ok "RK_HEAL=0: not healed, and why" || bad "RK_HEAL=0: no word why: $(grep -E 'rejoined|heal' "$work/nh.log")"

sup ref4 4 --recovery disk
st=$?
[[ $st == 0 ]] && ok "4 ranks: fault-free run finishes" || bad "4 ranks: fault-free run: exit $st"
sup heal4 4 --recovery inplace --inject "crash@step=10:rank=2,hang@step=22:rank=3"
check heal4 ref4 "4 ranks" $?
incidents heal4 healed 2 "4 ranks"

it_finish
