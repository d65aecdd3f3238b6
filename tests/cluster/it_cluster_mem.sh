#!/usr/bin/env bash
# Relaunch from memory across hosts (docs/recovery.md "Across hosts"), on the test cluster of
# network namespaces (tests/cluster/net.sh): `rk run --hosts` in host 1, rk train under one
# mpirun over 3 hosts x 2 ranks, host 4 a spare. Each node's agent makes the job's snapshot
# directory on its node (a directory of its own: the rig's hosts share one /dev/shm, so a
# rank that read another host's directory would be seen) and each rank puts into its own
# host's. (a) fault-free: the reference weights; one directory per host, each holding only
# its own ranks, all removed at the end. (b) rank 3 (on h2) crashes at step 25: every rank is
# relaunched on the same hosts and restores from its own node's snapshot: the status line and
# the incident say node memory at step 24 or 25 (newer than the disk's step 20), and the
# weights are the fault-free run's. Partner copies
# (docs/recovery.md "Partner copies on another host"): every rank pins a generation every 5
# steps (--partner-every 5) and each agent sends its ranks' pins to the next host's agent
# through rk run. (c) (--partner-every 20) every process of host 2 SIGKILLed once h3 holds
# the same pin (step 20 or 40) of both of h2's ranks, 2 and 3: the
# relaunch puts ranks 2 and 3 on the spare h4 and leaves every other rank where it was
# (placement is stable: ranks 4 and 5 stay on h3 with their snapshots); rk run fetches
# each moving rank's partner copy onto its new host first, so every rank restores from node
# memory (the disk holds nothing newer: no checkpoint before the end), the events say partner
# for ranks 2 and 3, and the weights are the fault-free run's. (d) hosts 2 and 3 SIGKILLed
# together (spares h4, h5): ranks 2 and 3 lost both their own copy (h2) and their partner's
# (h3): the events say disk for them, the relaunch restores from disk, with the fault-free
# weights. Skips (77) without root/namespaces, mpirun or Fashion-MNIST.
# shellcheck disable=SC2015
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/itlib.sh
. "$here/../itlib.sh"
# shellcheck source=tests/cluster/net.sh
. "$here/net.sh"
rig_need || exit $?
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
it_need_data
it_init it_cluster_mem
R=$here/rig
name=$(rig_name cm)
rig_autoclean "$name"
rig_up "$name" 5 >/dev/null || { bad "rig up"; it_finish; exit; }
a1=$(rig_addr "$name" h1)
cd "$work" || exit 1
export RK_SNAP_EVERY=1 # every step: not timed, so the steps restored do not hang on the speed
python3 "$RK_SRC/tests/make_subset.py" "$DATA" "$work/sub" 6400 1000 >/dev/null || bad "make subset"
mpiargs=()
for a in --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0; do mpiargs+=(--launcher-arg "$a"); done
run=("$RK" run --hosts h1:2,h2:2,h3:2 --listen "$a1:0" --rsh "$R rsh $name" --node-timeout 3
     --heartbeat-timeout 20 --startup-timeout 90 --partner-every 5 "${mpiargs[@]}")
train=("$RK" train --data "$work/sub" --threads 1 --seed 3 --model cnn-small --max-steps 60 --no-eval
       --ckpt-every 10)
weights() { sed -n 's/.*weights xxh64 \([0-9a-f]*\).*/\1/p' "$1" | tail -1; }
# snapdirs LOG: "NODE DIR" a line, for every agent's snapshot directory the log names
snapdirs() { sed -n 's/^rk agent (node \([0-9]*\)): the ranks. snapshots in memory on this node: \(.*\)$/\1 \2/p' "$1"; }
# all_gone LOG WHAT: every snapshot directory an agent named no longer exists (a SIGKILLed
# agent's is removed here, and said)
all_gone() {
  local k d left=()
  while read -r k d; do
    [[ -e $d ]] && left+=("$d")
  done < <(snapdirs "$1")
  if ((${#left[@]} == 0)); then
    ok "$2 every agent's snapshot directory removed"
  elif [[ -n ${3-} ]]; then
    ok "$2 ${#left[@]} directory left by the SIGKILLed agent: ${left[*]} (removed by the test)"
    rm -rf -- "${left[@]}"
  else
    bad "$2 snapshot directories left: ${left[*]}"
    rm -rf -- "${left[@]}"
  fi
}

# ---- (a) fault-free ---------------------------------------------------------------------
rig_spawn "$name" h1 "${run[@]}" --spare-hosts h4:2 --ckpt-dir "$work/cka" --events "$work/a.ev" \
  --inject 'slow@step=0:rank=0:ms=100:for=60' -- "${train[@]}" >a.log 2>&1
sup=$RIG_PID
pids+=("$sup")
# once rank 5 (on h3) holds a generation, every host's directory holds its own ranks only
declare -A dir=()
rank5_put() {
  while read -r k d; do dir[$k]=$d; done < <(snapdirs a.log)
  [[ -n ${dir[2]-} ]] && compgen -G "${dir[2]}/rank-5/snap-*.safetensors" >/dev/null
}
wait_for rank5_put 60
if [[ -n ${dir[0]-} && -n ${dir[1]-} && -n ${dir[2]-} ]]; then
  layout=$(for k in 0 1 2; do printf '%s:' "h$((k + 1))"; (cd "${dir[$k]}" && ls -d rank-* 2>/dev/null | tr '\n' ' '); done)
  [[ ${dir[0]} != "${dir[1]}" && ${dir[1]} != "${dir[2]}" && $layout == "h1:rank-0 rank-1 h2:rank-2 rank-3 h3:rank-4 rank-5 " ]] \
    && ok "(a) one snapshot directory a host, each with its own ranks: $layout" \
    || bad "(a) the hosts' directories: $layout"
  st=$(stat -c %a "${dir[1]}")
  [[ $st == 700 ]] && ok "(a) h2's directory is 0700" || bad "(a) h2's directory is $st"
else
  bad "(a) no snapshot directory for every host: $(grep -v '^rk agent' a.log | tail -3)"
fi
wait "$sup"
st=$?
ref=$(weights a.log)
[[ $st == 0 && -n $ref ]] && ok "(a) fault-free, 3 hosts x 2 ranks: exit 0, weights $ref" \
  || bad "(a) fault-free: exit $st: $(grep -v '^rk agent' a.log | tail -5)"
grep -q "recovery from memory: each host's agent keeps its ranks' snapshots" a.log \
  && ok "(a) rk run says each host keeps its ranks' snapshots" || bad "(a) no status line for memory recovery"
all_gone a.log "(a)"

# ---- (b) rank 3 crashes: every rank restores from its own node's memory ------------------
rig_exec "$name" h1 "${run[@]}" --spare-hosts h4:2 --ckpt-dir "$work/ckb" --events "$work/b.ev" \
  --inject 'crash@step=25:rank=3' -- "${train[@]}" >b.log 2>&1
st=$?
[[ $st == 0 ]] && ok "(b) rk run exit 0" || bad "(b) rk run exit $st: $(grep -v '^rk agent' b.log | tail -5)"
[[ -n $ref && "$(weights b.log)" == "$ref" ]] && ok "(b) final weights $ref equal the fault-free run's" \
  || bad "(b) weights $(weights b.log), fault-free $ref"
at=$(sed -n 's/.*launch 1: resumed from node memory at step \([0-9]*\).*/\1/p' b.log | head -1)
[[ $at == 24 || $at == 25 ]] && ok "(b) launch 1 resumed from node memory at step $at (disk holds step 20)" \
  || bad "(b) resumed: $(grep -v '^rk agent' b.log | grep -i 'resumed\|snapshot' | head -4)"
grep -q '"kind":"crash","rank":3,.*"action":"relaunch".*; resumed from node memory at step 2[45]"' b.ev \
  && ok "(b) the crash's incident says node memory" || bad "(b) events: $(cut -c1-300 b.ev)"
grep -q '"kind":"snapshot_off"' b.ev && bad "(b) snapshot_off: $(grep snapshot_off b.ev)" || ok "(b) no snapshot_off"
all_gone b.log "(b)"

# ---- (c) host 2 lost: its ranks' partner copies go to their new hosts: node memory --------
rig_spawn "$name" h1 "${run[@]}" --spare-hosts h4:2 --ckpt-dir "$work/ckc" --events "$work/c.ev" \
  --summary-json "$work/c.sum" --partner-every 20 --inject 'slow@step=0:rank=0:ms=150:for=50' -- "${train[@]}" --ckpt-every 100 \
  >c.log 2>&1
sup=$RIG_PID
pids+=("$sup")
# held_at DIR RANK: the newest step of RANK's partner copies held in DIR (-1: none)
held_at() {
  local f n=-1
  for f in "$1"/held/rank-"$2"/snap-*.safetensors; do
    [[ $f =~ snap-0*([0-9]+)\.safetensors$ ]] && n=${BASH_REMATCH[1]}
  done
  echo "$n"
}
# h2's ranks' partner is h3 (the next host): once h3 holds the same pin of both ranks that
# will move (2 and 3), h2 goes; with copies of different steps the fetch takes the older, which
# is as good, but a copy that lags on a loaded machine let the run go on far past it.
# (No disk checkpoint before the end: a run slowed past step 50 restored from a newer disk
# checkpoint, rightly, and the test read it as a failure.)
# partners_hold: h3 holds step 20 (or 40) of ranks 2 and 3, the same; their steps in $held
partners_hold() {
  local d3
  d3=$(snapdirs c.log | sed -n 's/^2 //p' | head -1)
  [[ -n $d3 ]] || return 1
  held="$(held_at "$d3" 2) $(held_at "$d3" 3)"
  [[ $held =~ ^(20|40)\ (20|40)$ && ${held% *} == "${held#* }" ]]
}
if wait_for partners_hold 120; then
  victims=$(ip netns pids "$name-h2")
  # shellcheck disable=SC2086
  kill -9 $victims
  ok "(c) SIGKILLed host 2's $(echo "$victims" | wc -w) processes once ranks 2 and 3's partner copies held steps $held"
else
  bad "(c) the partner copies of ranks 2 and 3 never held one step, 20 or 40: $(grep -v '^rk agent' c.log | tail -3)"
fi
wait "$sup"
st=$?
[[ $st == 0 ]] && ok "(c) rk run exit 0" || bad "(c) rk run exit $st: $(grep -v '^rk agent' c.log | tail -5)"
[[ -n $ref && "$(weights c.log)" == "$ref" ]] && ok "(c) final weights $ref equal the fault-free run's" \
  || bad "(c) weights $(weights c.log), fault-free $ref"
grep -q "relaunch 1 on 6 ranks (devices h1:0,h1:1,h4:0,h4:1,h3:0,h3:1)" c.log \
  && ok "(c) relaunched with ranks 2 and 3 on the spare h4, the others where they were" \
  || bad "(c) $(grep relaunch c.log)"
n=$(grep -c '"kind":"snapshot_fetch".*"action":"partner"' c.ev)
[[ $n == 2 ]] && grep -q '"kind":"snapshot_fetch","rank":2,.*"action":"partner"' c.ev \
  && grep -q '"kind":"snapshot_fetch","rank":3,.*"action":"partner"' c.ev \
  && ok "(c) 2 events: ranks 2 and 3 got their snapshots from partner copies" \
  || bad "(c) $n partner events: $(grep snapshot_fetch c.ev | cut -c1-300)"
at=$(sed -n 's/.*launch 1: resumed from node memory at step \([0-9]*\).*/\1/p' c.log | head -1)
[[ -n $at ]] && ((at >= 20)) && grep -q '"kind":"node_lost".*; resumed from node memory at step' c.ev \
  && ok "(c) every rank resumed from node memory at step $at; the node loss's incident says so" \
  || bad "(c) resumed: $(grep -v '^rk agent' c.log | grep -i 'resumed\|snapshot' | head -4) / $(grep node_lost c.ev | cut -c1-300)"
# the nodes' snapshot memory (SNAP_MEM), their own and the partner copies, in the summary,
# the events and rk run's last lines
python3 - c.sum c.ev <<'PY' && ok "(c) the summary, the events and rk run's end name the nodes' snapshot memory and the partner copies'" || bad "(c) memory: $(grep -o '"snapshot[a-z_]*": [0-9]*' c.sum | tr '\n' ' ') $(grep -o 'snapshots in memory.*' c.log | head -2)"
import json, re, sys
s = json.load(open(sys.argv[1]))
ev = [json.loads(l) for l in open(sys.argv[2])]
assert s["snapshot_bytes_peak"] > 0 and s["snapshot_held_bytes_peak"] > 0, s
on = [e["detail"] for e in ev if e["kind"] == "snapshot_on"]
peak = [e["detail"] for e in ev if e["kind"] == "snapshot_peak"]
assert on and re.search(r"on the job's nodes; h1 [0-9.]+ MiB \(partner copies", on[0]), on
assert peak and "partner copies on other nodes peaked at %d bytes" % s["snapshot_held_bytes_peak"] in peak[0], peak
PY
grep -q "rk run: snapshots in memory on, peak [0-9.]* MiB (partner copies [0-9.]* MiB)" c.log \
  && ok "(c) rk run's last lines: the snapshots' peak and the partner copies'" \
  || bad "(c) last lines: $(grep 'rk run: snapshots in memory' c.log)"
all_gone c.log "(c)" killed

# ---- (d) hosts 2 and 3 lost: ranks 2 and 3 lost both copies: disk, with an event ---------
rig_spawn "$name" h1 "${run[@]}" --spare-hosts h4:2,h5:2 --ckpt-dir "$work/ckd" --events "$work/d.ev" \
  --inject 'slow@step=0:rank=0:ms=150:for=40' -- "${train[@]}" >d.log 2>&1
sup=$RIG_PID
pids+=("$sup")
if wait_for '[[ "$(cat ckd/latest 2>/dev/null)" == ckpt-0000000000[23]0.safetensors ]]' 90; then
  victims="$(ip netns pids "$name-h2") $(ip netns pids "$name-h3")"
  # shellcheck disable=SC2086
  kill -9 $victims
  ok "(d) SIGKILLed hosts 2 and 3's $(echo $victims | wc -w) processes after $(cat ckd/latest)"
else
  bad "(d) no checkpoint of step 20 or 30: $(grep -v '^rk agent' d.log | tail -3)"
fi
wait "$sup"
st=$?
[[ $st == 0 ]] && ok "(d) rk run exit 0" || bad "(d) rk run exit $st: $(grep -v '^rk agent' d.log | tail -5)"
[[ -n $ref && "$(weights d.log)" == "$ref" ]] && ok "(d) final weights $ref equal the fault-free run's" \
  || bad "(d) weights $(weights d.log), fault-free $ref"
grep -q "relaunch 1 on 6 ranks (devices h1:0,h1:1,h4:0,h4:1,h5:0,h5:1)" d.log \
  && ok "(d) relaunched on h1 and the spares h4, h5" || bad "(d) $(grep relaunch d.log)"
grep -q '"kind":"snapshot_fetch","rank":2,.*"action":"disk".*no partner copy of its snapshot is left' d.ev \
  && grep -q '"kind":"snapshot_fetch","rank":3,.*"action":"disk"' d.ev \
  && ok "(d) events: ranks 2 and 3 have no partner copy left: disk" \
  || bad "(d) events: $(grep snapshot_fetch d.ev | cut -c1-300)"
grep -q '"kind":"node_lost".*; resumed from disk' d.ev \
  && ok "(d) the node loss's incident says disk" \
  || bad "(d) $(grep -v '^rk agent' d.log | grep -i 'snapshot\|resumed' | head -4) / $(grep node_lost d.ev | cut -c1-300)"
all_gone d.log "(d)" killed

it_finish
