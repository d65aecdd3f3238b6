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
# weights are the fault-free run's. (c) every process of host 2 SIGKILLed: its ranks go to
# the spare h4, which holds no snapshot of theirs, so no step is held by every rank and the
# relaunch restores from disk, with the fault-free weights. Skips (77) without root/namespaces,
# mpirun or Fashion-MNIST.
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
rig_up "$name" 4 >/dev/null || { bad "rig up"; it_finish; exit; }
a1=$(rig_addr "$name" h1)
cd "$work" || exit 1
export RK_SNAP_EVERY=1 # every step: not timed, so the steps restored do not hang on the speed
python3 "$RK_SRC/tests/make_subset.py" "$DATA" "$work/sub" 6400 1000 >/dev/null || bad "make subset"
mpiargs=()
for a in --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0; do mpiargs+=(--launcher-arg "$a"); done
run=("$RK" run --hosts h1:2,h2:2,h3:2 --spare-hosts h4:2 --listen "$a1:0" --rsh "$R rsh $name"
     --node-timeout 3 --heartbeat-timeout 20 --startup-timeout 90 "${mpiargs[@]}")
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
rig_spawn "$name" h1 "${run[@]}" --ckpt-dir "$work/cka" --events "$work/a.ev" \
  --inject 'slow@step=0:rank=0:ms=100:for=60' -- "${train[@]}" >a.log 2>&1
sup=$RIG_PID
pids+=("$sup")
# once rank 5 (on h3) holds a generation, every host's directory holds its own ranks only
declare -A dir=()
for ((i = 0; i < 1200; i++)); do
  while read -r k d; do dir[$k]=$d; done < <(snapdirs a.log)
  [[ -n ${dir[2]-} ]] && compgen -G "${dir[2]}/rank-5/snap-*.safetensors" >/dev/null && break
  sleep 0.05
done
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
rig_exec "$name" h1 "${run[@]}" --ckpt-dir "$work/ckb" --events "$work/b.ev" \
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

# ---- (c) host 2 lost: its ranks on the spare, which has none of their snapshots: disk -----
rig_spawn "$name" h1 "${run[@]}" --ckpt-dir "$work/ckc" --events "$work/c.ev" \
  --inject 'slow@step=0:rank=0:ms=150:for=40' -- "${train[@]}" >c.log 2>&1
sup=$RIG_PID
pids+=("$sup")
for ((i = 0; i < 1800; i++)); do
  [[ "$(cat ckc/latest 2>/dev/null)" == ckpt-0000000000[23]0.safetensors ]] && break
  sleep 0.05
done
if [[ "$(cat ckc/latest 2>/dev/null)" == ckpt-* ]]; then
  victims=$(ip netns pids "$name-h2")
  # shellcheck disable=SC2086
  kill -9 $victims
  ok "(c) SIGKILLed host 2's $(echo "$victims" | wc -w) processes after $(cat ckc/latest)"
else
  bad "(c) no checkpoint of step 20 or 30: $(grep -v '^rk agent' c.log | tail -3)"
fi
wait "$sup"
st=$?
[[ $st == 0 ]] && ok "(c) rk run exit 0" || bad "(c) rk run exit $st: $(grep -v '^rk agent' c.log | tail -5)"
[[ -n $ref && "$(weights c.log)" == "$ref" ]] && ok "(c) final weights $ref equal the fault-free run's" \
  || bad "(c) weights $(weights c.log), fault-free $ref"
grep -q "relaunch 1 on 6 ranks (devices h1:0,h1:1,h3:0,h3:1,h4:0,h4:1)" c.log \
  && ok "(c) relaunched on h1, h3 and the spare h4" || bad "(c) $(grep relaunch c.log)"
grep -q "snapshot: no step that every rank holds in memory: resuming from disk" c.log \
  && grep -q '"kind":"node_lost".*; resumed from disk' c.ev \
  && ok "(c) no step held by every rank: the node loss's incident says disk" \
  || bad "(c) $(grep -v '^rk agent' c.log | grep -i 'snapshot\|resumed' | head -4) / $(grep node_lost c.ev | cut -c1-300)"
all_gone c.log "(c)" killed

it_finish
