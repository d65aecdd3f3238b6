#!/usr/bin/env bash
# The Slurm test rig (tests/slurm/rig): slurmctld and 3 `slurmd -N nodeK` on localhost come up
# idle; srun -N3 runs one task on each node (SLURM_NODEID 0,1,2); sbatch --wrap and salloc get
# 3 nodes, and srun --ntasks-per-node=1 inside them runs one task per node; each node has
# GRES gpu:2; an administrator's drain shows DRAIN with its reason and resume undoes it; the
# health check program runs on every slurmd within its interval, with SLURMD_NODENAME set;
# a second rig runs beside the first; rig down leaves no daemon and no state; a rig whose
# daemons fail to start fails with their logs and leaves nothing. Bad usage exits 2; not
# root, or no Slurm: skip (77). Prints how long `rig up` took.
# ok and bad always succeed: `check && ok ... || bad ...` is an if-then-else here.
# shellcheck disable=SC2015,SC2016
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/itlib.sh
. "$here/../itlib.sh"
R=$here/rig
if [[ $(id -u) -ne 0 ]]; then
  echo "SKIP: the Slurm test rig needs root"
  exit 77
fi
for c in /usr/sbin/slurmctld /usr/sbin/slurmd srun sbatch salloc scontrol sinfo; do
  if ! command -v "$c" >/dev/null; then
    echo "SKIP: $c not found (Debian: slurmctld slurmd slurm-client)"
    exit 77
  fi
done
it_init slurm_rig
name=rks$$
name2=rks$$b
# rig down both rigs on every exit, then it_init's own cleanup
_it_exit=$(trap -p EXIT)
_it_exit=${_it_exit#trap -- \'}
_it_exit=${_it_exit%\' EXIT}
# shellcheck disable=SC2064
trap "\"$R\" down $name; \"$R\" down $name2; \"$R\" down ${name}x; $_it_exit" EXIT
trap 'exit 1' INT TERM HUP

alive() { # the pid exists and is not a zombie
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  [[ ${s:0:1} != Z ]]
}
T() { timeout 60 "$@"; }

# ---- bad usage exits 2 with a message; not root is a skip ----------------------------------
for args in "" "up" "up bad/name" "up x 0" "up x 17" "up -x" "down" "env" "env nosuch$$" "bogus"; do
  # shellcheck disable=SC2086
  "$R" $args >"$work/out" 2>"$work/err"
  rc=$?
  if [[ $rc == 2 && -s $work/err ]]; then
    ok "rig $args: exit 2 ($(head -1 "$work/err" | head -c 70))"
  else
    bad "rig $args: exit $rc (want 2), stderr '$(head -c 200 "$work/err")'"
  fi
done
# not root: nobody runs a copy of the rig in $nobody_dir (itlib.sh; a clone under a 0700 home
# is out of its reach)
# shellcheck disable=SC2119 # no --suid
if it_nobody_dir; then
  cp "$here/rig" "$nobody_dir/" && chmod 0755 "$nobody_dir/rig"
  as_nobody "$nobody_dir/rig" up "$name-u" >"$work/out" 2>&1
  rc=$?
  if [[ $rc == 77 ]] && grep -q '^SKIP: .*root' "$work/out"; then
    ok "not root: rig up exits 77 with '$(head -1 "$work/out")'"
  else
    bad "not root: rig up exit $rc (want 77 and SKIP), output '$(cat "$work/out")'"
  fi
fi

# ---- up: 3 nodes, idle, with a health check every 2 s --------------------------------------
hc=$work/hc.sh
cat >"$hc" <<EOF
#!/bin/sh
echo "\$SLURMD_NODENAME \$(date +%s.%N)" >>"$work/hc.calls"
# (whole files: the test reads them while later checks run)
env >"$work/hc.env.\${SLURMD_NODENAME:-none}.\$\$" && mv "$work/hc.env.\${SLURMD_NODENAME:-none}.\$\$" "$work/hc.env.\${SLURMD_NODENAME:-none}"
/usr/bin/scontrol show node "\$SLURMD_NODENAME" >"$work/hc.node.\$SLURMD_NODENAME.\$\$" 2>&1
mv "$work/hc.node.\$SLURMD_NODENAME.\$\$" "$work/hc.node.\$SLURMD_NODENAME"
EOF
chmod +x "$hc"
t0=$EPOCHREALTIME
if ! RIG_HEALTHCHECK=$hc RIG_HEALTHCHECK_INTERVAL=2 "$R" up "$name" 3 >"$work/up.out" 2>&1; then
  bad "rig up $name 3 failed: $(cat "$work/up.out")"
  it_finish
  exit
fi
up_s=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
echo "rig up 3 nodes took ${up_s} s"
ok "rig up $name 3: $(head -1 "$work/up.out")"
st=$("$R" dir "$name")
eval "$("$R" env "$name")"
[[ $SLURM_CONF == "$st/slurm.conf" && -s $SLURM_CONF ]] && ok "rig env: SLURM_CONF=$SLURM_CONF" ||
  bad "rig env: SLURM_CONF='$SLURM_CONF' (state $st)"
states=$(sinfo -h -N -o '%N %t' | sort -u | tr '\n' ' ')
[[ $states == "node1 idle node2 idle node3 idle " ]] && ok "sinfo: $states" || bad "sinfo: '$states'"
mapfile -t dpids < <(awk '{print $1}' "$st"/pids/*.pid)
nd=0
for p in "${dpids[@]}"; do alive "$p" && nd=$((nd + 1)); done
comms=$(for p in "${dpids[@]}"; do cat "/proc/$p/comm"; done | sort | uniq -c | tr -s ' \n' ' ')
[[ $nd == 4 && $comms == " 1 slurmctld 3 slurmd " ]] &&
  ok "4 daemons under their own names:$comms" || bad "daemons: $nd alive, names '$comms'"

# ---- srun -N3: one task per node -----------------------------------------------------------
out=$(T srun -N3 bash -c 'echo "$SLURM_NODEID $SLURMD_NODENAME"' 2>"$work/err" | sort)
[[ $(tr '\n' ' ' <<<"$out") == "0 node1 1 node2 2 node3 " ]] &&
  ok "srun -N3: $(tr '\n' ' ' <<<"$out")" || bad "srun -N3: '$out' $(cat "$work/err")"

# ---- sbatch --wrap and salloc: 3 nodes, srun --ntasks-per-node=1 inside --------------------
inner='echo "list $SLURM_JOB_NODELIST"; srun --ntasks-per-node=1 bash -c "echo task \$SLURM_NODEID \$SLURMD_NODENAME"'
# (not sbatch --wait: it polls every 10 s)
js=none
if jid=$(T sbatch --parsable -N3 -o "$work/batch.out" --wrap "$inner" 2>"$work/sb.out"); then
  for ((i = 0; i < 300; i++)); do
    js=$(scontrol show job "$jid" | grep -o 'JobState=[A-Z_]*')
    [[ $js == JobState=@(PENDING|RUNNING|CONFIGURING|COMPLETING) ]] || break
    sleep 0.1
  done
fi
got=$(sort "$work/batch.out" 2>/dev/null | tr '\n' ' ')
[[ $js == JobState=COMPLETED && $got == "list node[1-3] task 0 node1 task 1 node2 task 2 node3 " ]] &&
  ok "sbatch --wrap -N3: $js, $got" || bad "sbatch: $js, '$got' $(cat "$work/sb.out")"
got=$(T salloc -N3 bash -c "$inner" 2>"$work/err" | sort | tr '\n' ' ')
[[ $got == "list node[1-3] task 0 node1 task 1 node2 task 2 node3 " ]] &&
  ok "salloc -N3: $got" || bad "salloc: '$got' $(cat "$work/err")"

# ---- GRES ----------------------------------------------------------------------------------
g=$(scontrol show node node1 | grep -o 'Gres=[^ ]*')
[[ $g == Gres=gpu:2 ]] && ok "scontrol show node node1: $g" || bad "node1 GRES: '$g'"
got=$(T srun -N1 --gres=gpu:2 printenv SLURM_GPUS_ON_NODE 2>"$work/err")
[[ $got == 2 ]] && ok "srun --gres=gpu:2: SLURM_GPUS_ON_NODE=2" ||
  bad "srun --gres=gpu:2: '$got' $(cat "$work/err")"

# ---- an administrator's drain and resume ---------------------------------------------------
scontrol update nodename=node2 state=drain reason="admin test" 2>"$work/err" ||
  bad "scontrol drain: $(cat "$work/err")"
st2=$(sinfo -h -n node2 -N -o '%t|%E')
reason=$(scontrol show node node2 | grep -o 'Reason=.*')
[[ $st2 == "drain|admin test" && $reason == "Reason=admin test ["* ]] &&
  ok "drain node2: sinfo '$st2', $reason" || bad "drain node2: sinfo '$st2', '$reason'"
scontrol update nodename=node2 state=resume 2>"$work/err" || bad "scontrol resume: $(cat "$work/err")"
for ((i = 0; i < 50; i++)); do # a resumed node is idle* (not responding) until pinged
  st2=$(sinfo -h -n node2 -N -o '%t|%E')
  [[ $st2 == "idle|none" ]] && break
  sleep 0.2
done
[[ $st2 == "idle|none" ]] && ok "resume node2: sinfo '$st2'" || bad "resume node2: sinfo '$st2'"

# ---- the health check: every slurmd within its interval (2 s), with SLURMD_NODENAME --------
: >"$work/hc.calls"
# until each node's check ran twice (60 s at most: 2 s intervals on a loaded machine)
hc_twice() {
  local k
  for k in 1 2 3; do (($(grep -c "^node$k " "$work/hc.calls") >= 2)) || return 1; done
}
t0=$SECONDS
for ((i = 0; i < 600; i++)); do hc_twice && break; sleep 0.1; done
for k in 1 2 3; do
  c=$(grep -c "^node$k " "$work/hc.calls")
  ((c >= 2)) && ok "health check ran on node$k $c times in $((SECONDS - t0)) s" ||
    bad "health check on node$k: $c calls in $((SECONDS - t0)) s ($(tr '\n' ' ' <"$work/hc.calls"))"
done
grep -q '^ ' "$work/hc.calls" && bad "a health check ran without SLURMD_NODENAME"
if [[ -s $work/hc.env.node1 ]]; then
  echo "health check environment (node1): $(sort "$work/hc.env.node1" | tr '\n' ' ')"
  grep -qx 'SLURMD_NODENAME=node1' "$work/hc.env.node1" && ok "health check env: SLURMD_NODENAME=node1" ||
    bad "health check env lacks SLURMD_NODENAME=node1"
  # slurmd gives it no PATH and no SLURM_CONF: the rig's wrapper adds SLURM_CONF, nothing else
  others=$(grep -vE '^(SLURMD_NODENAME|SLURM_CONF|PWD|SHLVL|_|OLDPWD)=' "$work/hc.env.node1" | tr '\n' ' ')
  grep -qx "SLURM_CONF=$SLURM_CONF" "$work/hc.env.node1" && [[ -z $others ]] &&
    ok "health check env: SLURM_CONF (from the rig's wrapper), no PATH, nothing else" ||
    bad "health check env: SLURM_CONF $(grep SLURM_CONF "$work/hc.env.node1"), others '$others'"
  grep -q '^NodeName=node2 ' "$work/hc.node.node2" &&
    ok "scontrol in the health check reaches the controller ($(grep -o 'State=[^ ]*' "$work/hc.node.node2"))" ||
    bad "scontrol in the health check: $(head -c 200 "$work/hc.node.node2")"
else
  bad "no health check environment recorded"
fi

# ---- a second rig beside the first ---------------------------------------------------------
if "$R" up "$name2" 1 >"$work/up2.out" 2>&1; then
  a=$(SLURM_CONF=$("$R" dir "$name2")/slurm.conf T srun -N1 printenv SLURM_CLUSTER_NAME)
  b=$(T srun -N1 printenv SLURM_CLUSTER_NAME)
  [[ $a == "rk-$name2" && $b == "rk-$name" ]] && ok "two rigs at once: $a, $b" ||
    bad "two rigs: '$a' '$b'"
  "$R" down "$name2"
else
  bad "second rig: $(cat "$work/up2.out")"
fi

# ---- down: no daemon, no state, no job left (one is running) -------------------------------
zz=$((4000 + $$ % 1000)).5
sleeps() { # the pids of this test's job tasks (sleep $zz), alive
  local f p
  for f in /proc/[0-9]*/cmdline; do
    p=${f#/proc/}
    p=${p%/cmdline}
    [[ $({ tr '\0' ' ' <"$f"; } 2>/dev/null) == *"sleep $zz " ]] && alive "$p" && echo "$p"
  done
}
T sbatch -N3 -o /dev/null --wrap "srun --ntasks-per-node=1 sleep $zz" >/dev/null 2>&1
for ((i = 0; i < 100; i++)); do
  [[ $(sleeps | wc -l) -ge 3 ]] && break
  sleep 0.1
done
n=$(sleeps | wc -l)
((n >= 3)) && ok "a job runs sleep $zz on 3 nodes before rig down" || bad "the job's tasks: $n running"
t0=$EPOCHREALTIME
"$R" down "$name" || bad "rig down exit $?"
echo "rig down took $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }') s"
left=
for p in "${dpids[@]}"; do alive "$p" && left+=" $p"; done
[[ -z $left && ! -e $st ]] && ok "rig down: daemons ${dpids[*]} gone, $st removed" ||
  bad "rig down: left pids '$left', state dir $(ls -d "$st" 2>&1)"
left=$(sleeps | tr '\n' ' ')
[[ -z $left ]] && ok "rig down: the job's tasks gone" || bad "rig down left the job's tasks: $left"
left=$(for f in /proc/[0-9]*/environ; do
  { tr '\0' '\n' <"$f"; } 2>/dev/null | grep -qx "RK_SLURM_RIG=$st" && p=${f#/proc/} && alive "${p%/environ}" && echo "${p%/environ}"
done)
[[ -z $left ]] && ok "rig down: no slurmstepd or daemon of the rig left" || bad "rig down left pids $left"
"$R" down "$name" && ok "rig down again: exit 0" || bad "rig down again: exit $?"

# ---- a rig that cannot start: exit 1 with the logs, nothing left ---------------------------
RIG_CONF_EXTRA='SelectType=select/bogus' RIG_UP_TIMEOUT=10 "$R" up "${name}x" 2 >"$work/out" 2>&1
rc=$?
[[ $rc == 1 ]] && grep -q 'select/bogus' "$work/out" && [[ ! -e ${RIG_SLURM_RUN:-/tmp}/rk-slurm-${name}x ]] &&
  ok "failing rig up: exit 1, log tails shown, state removed" ||
  bad "failing rig up: exit $rc, $(head -c 300 "$work/out")"
left=$(for f in /proc/[0-9]*/environ; do
  { tr '\0' '\n' <"$f"; } 2>/dev/null | grep -qx "RK_SLURM_RIG=.*rk-slurm-${name}x" && p=${f#/proc/} && alive "${p%/environ}" && echo "${p%/environ}"
done)
[[ -z $left ]] && ok "failing rig up: no daemon left" || bad "failing rig up left pids $left"

it_finish
