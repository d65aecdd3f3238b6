#!/usr/bin/env bash
# rekindle under a real Slurm (the rig of tests/slurm/rig: slurmctld and 3 slurmd on
# localhost). (a) `rk doctor --slurm` as each slurmd's HealthCheckProgram, on a simulated
# fleet whose GPU 1 on node2 is made to fail by a textfile sensor (crit VRM ripple and fan
# vibration): node2 is drained with the reason "rk: GPU 1 (bus ...) score N: ...", and
# resumed once the sensor file is gone; an administrator's drain of node3 is left alone, with
# its GPUs failing or not; --dry-run changes nothing. (b) `rk doctor --gres` leaves the failing
# GPU out. (c) `rk run --launcher srun --hosts slurm:3` in a 3-node allocation (the agents and
# the ranks started by srun): a rank crash, then node2's agent step cancelled (node lost,
# quarantined, drained by --slurm-drain, left out of the next srun with --exclude), and the
# job ends with the fault-free run's parameters, bit for bit. Skips (77) without root, Slurm,
# torch or Fashion-MNIST.
# ok and bad always succeed: `check && ok ... || bad ...` is an if-then-else here.
# shellcheck disable=SC2015
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/itlib.sh
. "$here/../itlib.sh"
R=${RK_SLURM_RIG:-$here/rig}
if [[ $(id -u) -ne 0 ]]; then
  echo "SKIP: the Slurm test rig needs root"
  exit 77
fi
for c in /usr/sbin/slurmctld /usr/sbin/slurmd srun salloc scontrol sinfo squeue scancel; do
  command -v "$c" >/dev/null || { echo "SKIP: $c not found (Debian: slurmctld slurmd slurm-client)"; exit 77; }
done
py=$("$RK_SRC/tests/pyfind.sh" torch xxhash numpy) || { echo "$py"; exit 77; }
it_need_data
it_init it_slurm
name=rkt$$
_it_exit=$(trap -p EXIT)
_it_exit=${_it_exit#trap -- \'}
_it_exit=${_it_exit%\' EXIT}
# shellcheck disable=SC2064
trap "\"$R\" down $name >/dev/null 2>&1; $_it_exit" EXIT
trap 'exit 1' INT TERM HUP
now() { echo "$EPOCHREALTIME"; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# ---- the rig, with rk doctor --slurm as every node's health check ----------------------------
HCI=2 # HealthCheckInterval, seconds
mkdir -p "$work/tf/node1" "$work/tf/node2" "$work/tf/node3"
cat >"$work/hc.sh" <<EOF
#!/bin/sh
# slurmd's HealthCheckProgram: this node's simulated GPUs, its sensor files; a line in
# hc-NODE.runs once each check is done (what hc_wait counts)
"$RK" doctor --slurm --sim 2 --samples 1 --interval 0 --textfile-dir "$work/tf/\$SLURMD_NODENAME" >>"$work/hc-\$SLURMD_NODENAME.log" 2>&1
rc=\$?
echo "\$rc" >>"$work/hc-\$SLURMD_NODENAME.runs"
exit "\$rc"
EOF
chmod +x "$work/hc.sh"
t=$(now)
if ! RIG_CPUS=4 RIG_GPUS=3 RIG_HEALTHCHECK="$work/hc.sh" RIG_HEALTHCHECK_INTERVAL=$HCI \
  "$R" up "$name" 3 >"$work/up.log" 2>&1; then
  bad "rig up: $(tail -5 "$work/up.log")"
  it_finish
  exit
fi
ok "rig up: 3 nodes in $(sub "$t" "$(now)") s"
eval "$("$R" env "$name")"
state() { sinfo -h -N -n "$1" -o '%T|%E' 2>/dev/null | head -1; }
# wait_state NODE REGEX SECONDS: until sinfo's "STATE|REASON" of NODE matches
wait_state() {
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    [[ "$(state "$1")" =~ $2 ]] && return 0
    sleep 0.1
  done
  return 1
}
sensors() { # sensors NODE VOLTS HZ: GPU 1's VRM ripple and fan vibration on node NODE
  printf '%s\n' '# TYPE rk_sensor_vrm_ripple_volts gauge' \
    "rk_sensor_vrm_ripple_volts{gpu=\"1\"} $2" '# TYPE rk_sensor_fan_vibration_hertz gauge' \
    "rk_sensor_fan_vibration_hertz{gpu=\"1\"} $3" >"$work/tf/$1/sensor.prom.tmp"
  mv "$work/tf/$1/sensor.prom.tmp" "$work/tf/$1/sensor.prom"
}
sick() { sensors "$1" 0.180 520; } # crit both: score 35
healed() { sensors "$1" 0.020 90; }
hc_runs() { { wc -l <"$work/hc-$1.runs"; } 2>/dev/null || echo 0; }
# hc_wait NODE: until NODE's health check has run to its end twice from now, so that one of
# them began after what the test just did (60 s at most); says so when they did not
hc_wait() {
  local i n=$(($(hc_runs "$1") + 2))
  for ((i = 0; i < 600; i++)); do
    (($(hc_runs "$1") >= n)) && return 0
    sleep 0.1
  done
  bad "(a) $1's health check did not run twice in 60 s ($(hc_runs "$1") runs in all)"
  return 1
}

# ---- (a) the health check drains and resumes, and leaves an administrator's drain be -------
wait_state node1 '^idle' 10 && ok "(a) node1 idle with the health check running" \
  || bad "(a) node1: $(state node1)"
t=$(now)
sick node2
if wait_state node2 'drain.*\|rk: GPU 1 \(bus [0-9a-f:.]+\) score [0-9]+ vrm_ripple: ' $((4 * HCI + 10)); then
  ok "(a) node2 drained $(sub "$t" "$(now)") s after its GPU 1 failed (health check every $HCI s): $(state node2)"
else
  bad "(a) node2 not drained: '$(state node2)'; $(tail -3 "$work/hc-node2.log" 2>/dev/null)"
fi
grep -q "rk doctor: node node2: drained: rk: GPU 1" "$work/hc-node2.log" \
  && ok "(a) the health check said so in its output" || bad "(a) hc-node2.log: $(tail -2 "$work/hc-node2.log")"
# the card it was drained for is gone (one GPU left, which passes): not healed, stays drained
out=$("$RK" doctor --slurm --node node2 --sim 1 --samples 1 --interval 0 2>&1)
rc=$?
if [[ $rc == 1 && $out == *"stays drained: the GPU at bus 0000:01:00.0 it was drained for is not seen"* ]] &&
  [[ "$(state node2)" =~ ^drain ]]; then
  ok "(a) its GPU 1 gone, the other passing: node2 stays drained (exit 1)"
else
  bad "(a) GPU 1 gone: exit $rc, $(state node2): $(tail -1 <<<"$out")"
fi
[[ "$(state node1)" == idle* ]] && ok "(a) node1 left idle" || bad "(a) node1: $(state node1)"
# a sensor file cut while written: a reading went wrong, which is not a good one (stays
# drained); a simulated card has VRM and fan sensors of its own, so a file gone is judged by
# them (a real card's missing sensor: tests/test_slurm.c)
printf '# TYPE rk_sensor_vrm_ripple_volts gauge\nrk_sensor_vrm_ripple_volts{gpu="1' >"$work/tf/node2/sensor.prom"
out=$("$RK" doctor --slurm --node node2 --sim 2 --samples 1 --interval 0 --textfile-dir "$work/tf/node2" 2>&1)
rc=$?
[[ $rc == 1 && $out == *"stays drained: a reading went wrong"* ]] && [[ "$(state node2)" =~ ^drain ]] \
  && ok "(a) a sensor file cut while written: node2 stays drained (exit 1)" \
  || bad "(a) cut sensor file: exit $rc, $(state node2): $(tail -1 <<<"$out")"
t=$(now)
healed node2
if wait_state node2 '^idle' $((4 * HCI + 10)); then
  ok "(a) node2 resumed $(sub "$t" "$(now)") s after it healed: $(state node2)"
else
  bad "(a) node2 not resumed: '$(state node2)'"
fi
scontrol update nodename=node3 state=drain reason="admin: fan replaced, burn in first"
hc_wait node3
[[ "$(state node3)" =~ ^drain.*\|admin:\ fan ]] && ok "(a) an administrator's drain of node3 (GPUs healthy) left alone after 2 checks" \
  || bad "(a) node3: $(state node3)"
sick node3
hc_wait node3
[[ "$(state node3)" =~ ^drain.*\|admin:\ fan ]] && ok "(a) ... and with its GPU 1 failing: still the administrator's reason" \
  || bad "(a) node3 with a failing GPU: $(state node3)"
grep -q "it is already drained by someone else (reason \"admin: fan" "$work/hc-node3.log" \
  && ok "(a) the health check said it left node3 as it is" || bad "(a) hc-node3.log: $(tail -2 "$work/hc-node3.log")"
rm -f "$work/tf/node3/sensor.prom"
scontrol update nodename=node3 state=resume
# Slurm's FAIL state, an administrator's: not taken for "not drained", never overwritten
scontrol update nodename=node3 state=fail reason="admin: PSU flapping"
sick node3
hc_wait node3
rm -f "$work/tf/node3/sensor.prom"
hc_wait node3
[[ "$(state node3)" =~ \|admin:\ PSU\ flapping ]] && ok "(a) node3 in FAIL (an administrator's): its reason kept through a GPU failing and healing ($(state node3))" \
  || bad "(a) node3 in FAIL: $(state node3)"
scontrol update nodename=node3 state=resume
# dry run: says what it would do, changes nothing. Its sick sensors are in a directory of its
# own: node1's periodic health check keeps reading healthy ones, so it cannot drain node1
# between the sick file and the dry run (a race a loaded machine lost)
mkdir -p "$work/tf/dry"
sick dry
out=$("$RK" doctor --slurm --dry-run --node node1 --sim 2 --samples 1 --interval 0 --textfile-dir "$work/tf/dry" 2>&1)
rc=$?
if [[ $rc == 1 && $out == *"dry run: would run: scontrol update nodename=node1 state=drain"* ]]; then
  ok "(a) --dry-run: exit 1, says it would drain node1"
else
  bad "(a) --dry-run: exit $rc: $out"
fi
[[ "$(state node1)" == idle* ]] && ok "(a) --dry-run left node1 idle" || bad "(a) --dry-run: node1 $(state node1)"
SLURMD_NODENAME= "$RK" doctor --slurm --sim 2 --samples 1 >"$work/out" 2>&1
rc=$?
[[ $rc == 2 ]] && grep -q "needs the node's name" "$work/out" && ok "(a) --slurm without a node name: exit 2" \
  || bad "(a) --slurm without a node name: exit $rc: $(head -2 "$work/out")"

# ---- (b) gres.conf for the GPUs that pass ----------------------------------------------------
# (the sick sensors in the dry run's directory: node2's periodic check must not drain node2
# meanwhile, or (c) finds it drained)
sick dry
"$RK" doctor --gres --sim 2 --samples 1 --interval 0 --textfile-dir "$work/tf/dry" >"$work/gres.conf" 2>&1
rc=$?
if [[ $rc == 0 ]] && [[ $(grep -c '^Name=gpu ' "$work/gres.conf") == 1 ]] &&
  grep -q '^Name=gpu Type=rtx_3090 File=/dev/nvidia0$' "$work/gres.conf" &&
  grep -q '^#   GPU 1 (bus 0000:01:00.0) score' "$work/gres.conf"; then
  ok "(b) --gres: GPU 0 listed (Type=rtx_3090), the failing GPU 1 left out and named"
else
  bad "(b) --gres: exit $rc: $(cat "$work/gres.conf")"
fi

# ---- (c) rk run --launcher srun across the allocation ---------------------------------------
wait_state node2 '^idle' 20 && wait_state node3 '^idle' 20 || bad "(c) nodes not idle: $(sinfo -N)"
ex=("$py" "$RK_SRC/examples/pytorch/train_fashion_mnist.py" --subset 2048 --batch 32 --hash-every 10
    --data "$DATA" --steps 40 --ckpt-every 10)
run=("$RK" run --launcher srun --hosts slurm:3 -n 4 --listen 127.0.0.1:0 --node-timeout 3
     --heartbeat-timeout 20 --startup-timeout 90 --failure-threshold 1)
hash_of() { sed -n 's/^final step 40 params xxh64 \([0-9a-f]*\)$/\1/p' "$1" | tail -1; }
timeout 300 salloc -N3 --exclusive -Q "${run[@]}" --ckpt-dir "$work/ck0" -- "${ex[@]}" >"$work/c0.log" 2>&1
rc=$?
h0=$(hash_of "$work/c0.log")
[[ $rc == 0 && -n $h0 ]] && ok "(c) fault-free under srun: exit 0, parameters $h0" \
  || bad "(c) fault-free: exit $rc: $(grep -v '^rk agent' "$work/c0.log" | tail -5)"
grep -q "launcher srun (--hosts: srun starts an agent a node" "$work/c0.log" \
  && ok "(c) the agents and the ranks started by srun" || bad "(c) $(grep 'launcher' "$work/c0.log" | head -1)"
# the faults: rank 3 (node2:0) crashes at step 15 (quarantined: threshold 1); the relaunch is
# slowed from step 16, and once it has the checkpoint of step 20 node2's agent step is
# cancelled: node2 is lost, quarantined and drained, and the last launch runs without it
timeout 300 salloc -N3 --exclusive -Q "${run[@]}" --slurm-drain --ckpt-dir "$work/ck1" \
  --summary-json "$work/c1.sum" --events "$work/c1.ev" \
  --inject 'crash@step=15:rank=3,slow@step=16:rank=0:ms=150:for=30' -- "${ex[@]}" >"$work/c1.log" 2>&1 &
spid=$!
pids+=("$spid")
cancelled=''
for ((i = 0; i < 1800; i++)); do
  if [[ "$(cat "$work/ck1/latest" 2>/dev/null)" == ckpt-0000000000[23]0.safetensors ]] &&
    grep -q 'relaunch 1 ' "$work/c1.log"; then
    step=$(squeue -h -s -o '%i %j' | awk '$2 == "rk-agent-node2" { print $1 }' | head -1)
    if [[ -n $step ]]; then
      scancel --signal=KILL "$step" && cancelled=$step
      ok "(c) cancelled node2's agent step $step after $(cat "$work/ck1/latest")"
    fi
    break
  fi
  sleep 0.1
done
[[ -n $cancelled ]] || bad "(c) node2's agent step not cancelled: $(grep -v '^rk agent' "$work/c1.log" | tail -3)"
wait "$spid"
rc=$?
h1=$(hash_of "$work/c1.log")
[[ $rc == 0 ]] && ok "(c) the faulty run finished: exit 0" || bad "(c) the faulty run: exit $rc: $(grep -v '^rk agent' "$work/c1.log" | tail -5)"
[[ -n $h0 && $h1 == "$h0" ]] && ok "(c) the same parameters as the fault-free run, bit for bit ($h1)" \
  || bad "(c) parameters $h1, fault-free $h0"
grep -q 'device node2:0 quarantined' "$work/c1.log" && ok "(c) the crashed rank's device node2:0 quarantined" \
  || bad "(c) no quarantine of node2:0: $(grep -i quarant "$work/c1.log" | head -2)"
grep -q 'node 1 (node2) quarantined after 1 failure' "$work/c1.log" && ok "(c) node2 lost and quarantined" \
  || bad "(c) node2 not quarantined: $(grep -E 'node 1 \(node2\)' "$work/c1.log" | head -3)"
grep -q 'srun leaves out node2 (--exclude)' "$work/c1.log" && ok "(c) the last launch's srun leaves node2 out (--exclude)" \
  || bad "(c) no --exclude of node2: $(grep -E 'srun' "$work/c1.log" | grep -v '^rk agent' | tail -2)"
grep -Eq 'devices node1:0,node1:1,node1:2,node3:0' "$work/c1.log" && ok "(c) relaunched on node1 and the spare node3, 4 ranks (the global batch kept)" \
  || bad "(c) $(grep relaunch "$work/c1.log" | tail -2)"
[[ "$(json "$work/c1.sum" quarantined)" == 3 ]] && grep -q '"kind":"quarantine","rank":null,"device":"node2"' "$work/c1.ev" \
  && ok "(c) the summary counts 3 devices quarantined (node2:0, then node2's other two with it); the event names node2" \
  || bad "(c) summary quarantined $(json "$work/c1.sum" quarantined): $(grep quarantine "$work/c1.ev")"
if [[ "$(state node2)" =~ ^drain.*\|rk\ run:\ node\ lost\ 1\ time\ in\ Slurm\ job\ [0-9]+: ]]; then
  ok "(c) --slurm-drain drained node2: $(state node2)"
else
  bad "(c) node2 after --slurm-drain: '$(state node2)'"
fi

# ---- (d) the sbatch example of deploy/slurm, with a crash (RK_SLOTS: --exclusive gets all GPUs)
scontrol update nodename=node2 state=resume
wait_state node2 '^idle' 20 || bad "(d) node2 not idle: $(state node2)"
jid=$(RK="$RK" RK_SLOTS=2 RK_JOB_DIR="$work/job" RK_INJECT='crash@step=15:rank=1' \
  RK_RUN_ARGS='--node-timeout 3 --startup-timeout 90' \
  sbatch --parsable --gres=gpu:2 --chdir="$work" --output="$work/d.out" \
  "$RK_SRC/deploy/slurm/train.sbatch" "${ex[@]}" 2>"$work/d.err")
jst=''
for ((i = 0; i < 2400; i++)); do
  [[ -n $jid ]] || break
  jst=$(scontrol show job "$jid" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
  [[ $jst == COMPLETED || $jst == FAILED || $jst == CANCELLED || $jst == TIMEOUT || $jst == NODE_FAIL ]] && break
  sleep 0.1
done
hd=$(hash_of "$work/d.out")
if [[ $jst == COMPLETED && $hd == "$h0" && "$(json "$work/job/summary.json" restarts)" == 1 ]]; then
  ok "(d) deploy/slurm/train.sbatch: job $jid COMPLETED after 1 restart, the fault-free parameters ($hd)"
else
  bad "(d) deploy/slurm/train.sbatch: job '$jid' $jst, parameters '$hd': $(cat "$work/d.err") $(grep -v '^rk agent' "$work/d.out" 2>/dev/null | tail -4)"
fi
grep -q '4 ranks on devices node1:0,node1:1,node2:0,node2:1;' "$work/d.out" \
  && ok "(d) 4 ranks on node1 and node2, node3 (the allocation's last node) spare" \
  || bad "(d) $(grep -m1 'ranks on devices' "$work/d.out")"
it_finish
