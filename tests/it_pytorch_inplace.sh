#!/usr/bin/env bash
# Recovery in place for PyTorch jobs (docs/recovery.md, "In place"): 2 ranks of the PyTorch
# example (gloo on CPU) under `rk run --launcher local --recovery inplace` through a crash, a
# communication failure, a hang and a SIGKILL sent to rank 1 by its pid (found in rk run's
# process tree) end with the fault-free run's parameters, bit for bit; rank 0 keeps its
# process through all four (its pid, read from /proc at the start, is the one each incident
# names as kept, which rk run has from the kernel), each fault is one incident whose action is
# in_place and which says the job healed (rank 0 kept its state, the replacement took it) with
# at most the step in flight lost (the hang's with its stack dump), and rk run relaunched nothing; each replacement was the
# warm spare. Then 4 ranks through a crash, a communication failure and a hang of three
# different ranks: the 4-rank fault-free parameters, three in_place incidents, the spare each time.
# And two failures at once (ranks 1 and 2 crashing at one step), a rank SIGKILLed while
# another's replacement starts, and a replacement crashing at its first step: each replaced in
# place, the 4-rank fault-free parameters.
# And a failure that reaches its device's --failure-threshold is not replaced in place: the
# job is relaunched without the device. And with K timed at run time, a rank replaced after
# every original rank was (its survivor itself a replacement) takes the survivors' K; there
# rank 0 is replaced first, healed from rank 1 (whose parameters the new DDP's broadcast of
# rank 0's initial ones must not overwrite: it did, and the run ended with other weights).
# Skips (77) without a python3 that has torch, numpy and xxhash, or without Fashion-MNIST.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
py=$("$RK_SRC/tests/pyfind.sh" torch xxhash numpy) || { echo "$py"; exit 77; }
it_need_data
it_init it_pytorch_inplace
cd "$work" || exit 1
steps=48
ex=("$py" "$RK_SRC/examples/pytorch/train_fashion_mnist.py" --subset 1024 --batch 32 --hash-every 5
    --ckpt-every 20 --steps "$steps" --data "$DATA")
export RK_SNAP_EVERY=1 # snapshots every step, not timed: the test does not depend on the speed

# sup NAME N [rk run flags...]: N ranks under rk run; NAME.log, NAME.events, NAME.json
sup() {
  local name=$1 n=$2; shift 2
  "$RK" run -n "$n" --launcher local --heartbeat-timeout 5 --startup-timeout 300 --failure-threshold 100 \
    --ckpt-dir "$work/$name.ck" --events "$work/$name.events" "$@" \
    -- "${ex[@]}" --result "$work/$name.json" >"$work/$name.log" 2>&1
}
snapdir() { sed -n 's/.*recovery from memory: the ranks.* snapshots in \([^ ]*\) .*/\1/p' "$work/$1.log" | head -1; }
# newest NAME: the newest step rank 0 holds in memory, -1 if none yet
newest() {
  local d
  d=$(snapdir "$1")
  [[ -n $d ]] && ls "$d/rank-0" 2>/dev/null | sed -n 's/^snap-0*\([0-9][0-9]*\)\.safetensors$/\1/p' | sort -n | tail -1 | grep . \
    || echo -1
}

# Asked for where it cannot be: rk run says so (and runs the job)
out=$("$RK" run -n 1 --launcher local --recovery inplace -- true 2>&1)
[[ $out == *"recovery in place is off: it needs --ckpt-dir"* ]] && ok "no --ckpt-dir: rk run says recovery in place is off" ||
  bad "no --ckpt-dir: no word of it: $(grep -i 'place' <<<"$out")"

n=2
if sup ref "$n" --recovery disk; then ok "fault-free run finishes"
else bad "fault-free run: exit $?: $(tail -5 "$work/ref.log")"; it_finish; exit; fi
ref=$(json ref.json hash)

# rank 0 takes 1 s more a step from step 38 (the weights do not change): time to find rank
# 1's pid once step 40 is held, before the job ends
spec="crash@step=10:rank=1,commfail@step=20:rank=1,hang@step=30:rank=1,slow@step=38:rank=0:ms=1000"
sup inplace "$n" --recovery inplace --inject "$spec" &
sp=$!
pids+=("$sp")
first="" victim="" at=-1
wait_for 'first=$(rank_pid "$sp" 0 train_fashion_mnist.py) || ! kill -0 "$sp" 2>/dev/null' 300
[[ -n $first ]] && ok "rank 0 started as pid $first" || bad "no rank 0 found under rk run"
# Rank 1 by now is a warm spare that took the rank (its /proc environ, from before it had a
# rank, has no RANK): its pid is the one rk run had from the kernel when it said hello, written
# in rk run's line after the replacement; a process of rk run's tree running the script.
rank1_pid() {
  local p
  p=$(sed -n 's/.*after rank 1 was replaced (now pid \([0-9][0-9]*\)).*/\1/p' "$work/inplace.log" | tail -1)
  [[ -n $p ]] || return 1
  descendants "$sp" | grep -qx "$p" && tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null |
    grep -q train_fashion_mnist.py && echo "$p"
}
kill_held() {
  at=$(newest inplace)
  ((at >= 40)) || return 1
  victim=$(rank1_pid) && kill -9 "$victim" && return 0
  victim=""
  return 1
}
wait_for 'kill_held || ! kill -0 "$sp" 2>/dev/null' 300
[[ -n $victim ]] && ok "SIGKILL to rank 1 (pid $victim) with step $at held" \
  || bad "no rank 1 to kill once step 40 was held"
wait "$sp"
st=$?
[[ $st == 0 ]] && ok "the job with its faults finishes" || bad "exit $st: $(tail -8 "$work/inplace.log")"
h=$(json inplace.json hash 2>/dev/null)
[[ -n $h && $h == "$ref" ]] && ok "parameters hash $h equals the fault-free run's" \
  || bad "parameters hash '$h' differs from the fault-free $ref"
grep -q "0 restarts" "$work/inplace.log" && ok "no relaunch" || bad "a relaunch: $(grep restart "$work/inplace.log")"
# Each replacement was the warm spare: started once every rank could rejoin, and again after
# each replacement, it had imported torch before the fault and run the script ahead, its data
# read, to its first read of RANK (docs/recovery.md, "The warm spare")
sparen=$(grep -c "^rekindle: warm spare (pid [0-9]*, warmed in [0-9.]* s, the script run [0-9.]* s ahead to its read of RANK) is rank 1$" "$work/inplace.log")
[[ $sparen == 4 ]] && ok "each of the 4 replacements was the warm spare" ||
  bad "$sparen of the 4 replacements were the warm spare: $(grep -i spare "$work/inplace.log" | head -5)"

it_count "$py" - "$work/inplace.events" "$first" <<'PY'
import json, re, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
first = sys.argv[2]
def check(c, msg):
    print(("ok - " if c else "FAIL - ") + msg + ("" if c else f" (events: {[(e['kind'], e['action'], e['detail']) for e in ev]})"))
inp = [e for e in ev if e["action"] == "in_place"]
check(sorted(e["kind"] for e in inp) == ["commfail", "crash", "crash", "hang"],
      f"in-place incidents: {sorted(e['kind'] for e in inp)} (the crash, the commfail, the hang, the SIGKILL)")
for e in inp:
    check(e["rank"] == 1, f"{e['kind']}: rank {e['rank']} blamed")
    kept = re.search(r"ranks kept: 0 \(pid ([0-9]+)\)", e["detail"])
    check(kept and kept.group(1) == first, f"{e['kind']}: rank 0 kept as pid {kept and kept.group(1)}, the pid "
          f"it started with ({first})")
    if e["kind"] == "hang":
        check(e.get("stacks") and "stacks-rank1" in e["stacks"][0], f"hang: its stack dump {e.get('stacks')}")
    check(re.search(r"; healed at step [0-9]+: the ranks kept their state in memory and the replacement took theirs "
                    r"\(only the step in flight lost\)$", e["detail"]), f"{e['kind']}: '...{e['detail'][-120:]}'")
    check(0 <= e["lost_steps"] <= 1, f"{e['kind']}: {e['lost_steps']} steps lost, at most 1")
    check(e.get("recovery_s") is not None, f"{e['kind']}: recovered in {e.get('recovery_s')} s")
check(not [e for e in ev if e["action"] == "relaunch"], "no relaunch incident")
PY

# ---- a failure that reaches the device's threshold is not replaced in place ----------------
# --failure-threshold 2: rank 1's second crash sets device 1 aside; the job is relaunched on
# device 0 at once (before: replaced in place, then stopped to shrink)
n=2
sup thr "$n" --recovery inplace --failure-threshold 2 --inject "crash@step=20:rank=1,crash@step=40:rank=1"
st=$?
[[ $st == 0 ]] && ok "threshold: the job finishes" || bad "threshold: exit $st: $(tail -8 "$work/thr.log")"
grep -q "rank 1's device 1 reaches its failure threshold (2) with this failure: not replaced in place" \
  "$work/thr.log" && ok "threshold: the second crash is not replaced in place, and rk run says why" \
  || bad "threshold: no such line: $(grep -E 'in place|quarantine' "$work/thr.log" | head -5)"
it_count "$py" - "$work/thr.events" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
acts = [(e["kind"], e["action"], e["rank"]) for e in ev if e["kind"] in ("crash", "quarantine")]
ok = acts == [("crash", "in_place", 1), ("crash", "relaunch", 1), ("quarantine", "quarantine", 1)]
print(("ok - " if ok else "FAIL - ") + f"threshold: in place, then a relaunch and the quarantine: {acts}")
PY

# ---- every original rank replaced, K timed at run time (no RK_SNAP_EVERY) -------------------
# rank 0 crashes at step 10 (its replacement takes the survivor's K), then rank 1 at step 20:
# its survivor, rank 0, is itself a replacement. The new rank 1 must take that survivor's K and
# timing too; it kept its own (untimed) and, three puts later, broadcast a K alone: the job hung
# (bench/run_goodput's 10-minute runs, once every original rank had been replaced)
(unset RK_SNAP_EVERY; sup k2 "$n" --recovery inplace --inject "crash@step=10:rank=0,crash@step=20:rank=1")
st=$?
[[ $st == 0 ]] && ok "K timed: the job with its faults finishes" || bad "K timed: exit $st: $(tail -8 "$work/k2.log")"
h=$(json k2.json hash 2>/dev/null)
[[ -n $h && $h == "$ref" ]] && ok "K timed: parameters hash $h equals the fault-free run's" \
  || bad "K timed: parameters hash '$h' differs from the fault-free $ref"
it_count "$py" - "$work/k2.events" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
inp = [(e["kind"], e["rank"]) for e in ev if e["action"] == "in_place"]
ok = inp == [("crash", 0), ("crash", 1)] and not [e for e in ev if e["action"] == "relaunch" or e["kind"] == "hang"]
print(("ok - " if ok else "FAIL - ") + f"K timed: two in-place crashes, no hang, no relaunch: "
      f"{[(e['kind'], e['action'], e['detail'][:120]) for e in ev if e['kind'] not in ('inject',)]}")
PY

# ---- 4 ranks: a crash of rank 2, a communication failure of rank 3, a hang of rank 1 --------
n=4
if sup ref4 "$n" --recovery disk; then ok "4 ranks: fault-free run finishes"
else bad "4 ranks: fault-free run: exit $?: $(tail -5 "$work/ref4.log")"; it_finish; exit; fi
ref4=$(json ref4.json hash)
# finished4 NAME STATUS LABEL: run NAME (4 ranks) exited 0 with the 4-rank fault-free
# parameters and relaunched nothing
finished4() {
  local name=$1 st=$2 label=$3 h
  [[ $st == 0 ]] && ok "$label: the job with its faults finishes" || bad "$label: exit $st: $(tail -8 "$work/$name.log")"
  h=$(json "$name.json" hash 2>/dev/null)
  [[ -n $h && $h == "$ref4" ]] && ok "$label: parameters hash $h equals the fault-free run's" \
    || bad "$label: parameters hash '$h' differs from the fault-free $ref4"
  grep -q "0 restarts" "$work/$name.log" && ok "$label: no relaunch" || bad "$label: a relaunch: $(grep restart "$work/$name.log")"
}
sup in4 "$n" --recovery inplace --inject "crash@step=10:rank=2,commfail@step=22:rank=3,hang@step=34:rank=1"
finished4 in4 $? "4 ranks"
spares=$(sed -n 's/^rekindle: warm spare (pid [0-9]*, warmed in [0-9.]* s, the script run [0-9.]* s ahead to its read of RANK) is rank \([0-9]\)$/\1/p' "$work/in4.log" | tr '\n' ' ')
[[ $spares == "2 3 1 " ]] && ok "4 ranks: the warm spare became ranks 2, 3, 1 in turn" ||
  bad "4 ranks: the warm spare became ranks '$spares' (want 2 3 1)"
it_count "$py" - "$work/in4.events" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
def check(c, msg):
    print(("ok - " if c else "FAIL - ") + msg + ("" if c else f" (events: {[(e['kind'], e['action'], e['detail']) for e in ev]})"))
inp = [(e["kind"], e["rank"]) for e in ev if e["action"] == "in_place"]
check(inp == [("crash", 2), ("commfail", 3), ("hang", 1)], f"4 ranks: in-place incidents {inp}")
check(all(0 <= e["lost_steps"] <= 1 and e.get("recovery_s") is not None for e in ev if e["action"] == "in_place"),
      "4 ranks: each recovered, at most 1 step lost: "
      f"{[(e['lost_steps'], e.get('recovery_s')) for e in ev if e['action'] == 'in_place']}")
check(not [e for e in ev if e["action"] == "relaunch"], "4 ranks: no relaunch incident")
PY

# ---- 4 ranks: a failure during the recovery of another (docs/recovery.md) -------------------
# two_failures NAME: the job finishes with the 4-rank fault-free parameters, without a relaunch,
# each failure an in_place incident of its rank, the later one "during the recovery"
two_failures() {
  local name=$1
  finished4 "$name" "$2" "$name"
  it_count "$py" - "$work/$name.events" "$name" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
name = sys.argv[2]
inp = [e for e in ev if e["action"] == "in_place"]
ok = sorted((e["kind"], e["rank"]) for e in inp) == [("crash", 1), ("crash", 2)] and \
    " during the recovery of an earlier failure;" in inp[-1]["detail"] and \
    not [e for e in ev if e["action"] == "relaunch"] and \
    all(0 <= e["lost_steps"] <= 1 and e.get("recovery_s") is not None for e in inp)
print(("ok - " if ok else "FAIL - ") + f"{name}: two in-place crashes (ranks 1 and 2), the later during the "
      f"recovery, each recovered with at most 1 step lost: {[(e['kind'], e['rank'], e['lost_steps'], e['detail'][:160]) for e in inp]}")
PY
}
# ranks 1 and 2 crash at the same step: both replaced in one rendezvous (before, the second was
# given up on and the job relaunched from memory)
sup both "$n" --recovery inplace --inject "crash@step=12:rank=1,crash@step=12:rank=2"
two_failures both $?
grep -q "in place: every rank is stepping again, [0-9.]* s after ranks 1 (now pid [0-9]*), 2 (now pid [0-9]*) were replaced" \
  "$work/both.log" && ok "both: rk run says both ranks were replaced" \
  || bad "both: no line for both: $(grep 'stepping again' "$work/both.log")"
# rank 2 SIGKILLed (by its pid) while rank 1's replacement starts (cold: RK_SPARE=0, so that the
# recovery lasts the seconds of a Python start): its rendezvous is void, the survivors leave
# it (rank 0 made its store: it waited there for rank 2) and join rk run's next with both
RK_SPARE=0 sup during "$n" --recovery inplace --inject "crash@step=12:rank=1" &
sp=$!
pids+=("$sp")
victim=""
wait_for 'grep -q "crash: rank 1 died .* replacing it in place" "$work/during.log" || ! kill -0 "$sp" 2>/dev/null' 300
victim=$(rank_pid "$sp" 2 train_fashion_mnist.py) && kill -9 "$victim" &&
  ok "during: SIGKILL to rank 2 (pid $victim) during rank 1's replacement" || bad "during: no rank 2 to kill"
wait "$sp"
two_failures during $?
# (each its own line, not anchored: the ranks' stderr lines can come out joined; a survivor
# that had not begun to join epoch 1 when epoch 2 came joins epoch 2 without a void one)
n0=$(grep -oE "rekindle.torch: rank [03]: rejoined in place \(epoch 2, port [0-9]+(, after 1 void rendezvous)?\)" \
  "$work/during.log" | sort -u | wc -l)
nv=$(grep -oE "rekindle.torch: rank [03]: rejoined in place \(epoch 2, port [0-9]+, after 1 void rendezvous\)" \
  "$work/during.log" | wc -l)
[[ $n0 == 2 && $nv -ge 1 ]] && ok "during: ranks 0 and 3 rejoined epoch 2 ($nv of them after leaving the void epoch 1)" \
  || bad "during: $n0 of ranks 0 and 3 rejoined epoch 2, $nv after a void one: $(grep -E 'rejoin|void' "$work/during.log" | tail -8)"

# rank 1's replacement crashes at its first step (the spec twice: the second is the
# replacement's to fire), while the survivors are in their first backward on the new group:
# with 3 or more ranks its reduction is deferred to the backward's end (_reduce_deferred),
# whose collectives raised out of the script's backward; the survivors ended as communication
# failures 10 s later and the job was relaunched (bench/RESULTS.md, a cascade of 22 s)
sup first "$n" --recovery inplace --inject "crash@step=20:rank=1,crash@step=20:rank=1"
finished4 first $? first
it_count "$py" - "$work/first.events" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
inc = [(e["kind"], e["rank"], e["action"]) for e in ev
       if e["kind"] not in ("inject", "snapshot_on", "snapshot_peak", "snapshot_held")]
ok = inc == [("crash", 1, "in_place"), ("crash", 1, "in_place")]
print(("ok - " if ok else "FAIL - ") + f"first: two in-place crashes of rank 1 and nothing else (no commfail): {inc}")
PY

it_finish
