#!/usr/bin/env bash
# Integration test of rk's one command-line parser (cli/args.h), table-driven over every
# subcommand: a whole number given as a fraction, an exponent, hex, with spaces, a leading
# zero or empty, a non-finite or out-of-range number, and a path of the wrong kind
# (--ckpt-dir /proc/version, --init DIR, --textfile-dir /nonexistent, an output in a missing
# directory ...) is exit 2 before any work starts, with a message "rk CMD: ..." naming the flag
# and the value, and nothing is created on disk. Every subcommand's --help still works, and the
# full range of a seed (0..2^63-1) is accepted and an output into a checkpoint store refused. Needs RK, RK_TMP; no data set, GPU or MPI.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_args

W=$work/w
D=$W/data # an existing, empty directory
F=$W/file # an existing regular file
O=$W/out  # an existing, empty directory for outputs
M=$W/missing
mkdir -p "$D" "$O" "$work/logs"
printf 'x\n' >"$F"
snapshot() { (cd "$W" && find . | sort); }

# refused PATTERN ARGS...: rk ARGS (run in $W, at most 20 s) exits 2, the first line of
# stderr is "rk SUBCOMMAND: ..." and contains PATTERN, and $W is exactly as it was.
refused() {
  local pattern=$1
  shift
  local before
  before=$(snapshot)
  (cd "$W" && timeout 20 "$RK" "$@" </dev/null >"$work/logs/out" 2>"$work/logs/err")
  local rc=$? what="rk ${*:1:6}"
  local first
  first=$(head -1 "$work/logs/err")
  if [[ $rc -ne 2 ]]; then
    bad "$what ... ($pattern): exit $rc, want 2: $(head -c 300 "$work/logs/err")"
  elif [[ $first != "rk $1"* ]] || ! grep -qF -- "$pattern" <<<"$first"; then
    bad "$what ... : the message lacks '$pattern': $first"
  elif [[ $(snapshot) != "$before" ]]; then
    bad "$what ... ($pattern): files changed: $(diff <(echo "$before") <(snapshot) | head -5)"
  else
    ok "$what ... -> 2: $first"
  fi
}

TRAIN=(train --data "$D" --epochs 1 --max-steps 1)
RUN=(run -n 1 --health off --startup-timeout 2 --max-restarts 0)
DOCTOR=(doctor --sim 1 --samples 1 --interval 0)
EXPORTER=(exporter --sim 1 --listen 127.0.0.1:0)

# --- whole numbers, numbers and durations -------------------------------------------------
refused "--batch '1.5'" "${TRAIN[@]}" --batch 1.5
refused "--epochs ' 1'" "${TRAIN[@]}" --epochs " 1"
refused "--epochs '1 '" "${TRAIN[@]}" --epochs "1 "
refused "--seed '0x10'" "${TRAIN[@]}" --seed 0x10
refused "--seed '1e3'" "${TRAIN[@]}" --seed 1e3
refused "--seed '18446744073709551616'" "${TRAIN[@]}" --seed 18446744073709551616
# 2^63: once trained the whole run and then could not write its checkpoint's config
refused "--seed '9223372036854775808'" "${TRAIN[@]}" --seed 9223372036854775808
refused "--threads '010'" "${TRAIN[@]}" --threads 010
refused "--max-steps '10abc'" "${TRAIN[@]}" --max-steps 10abc
refused "--keep ''" "${TRAIN[@]}" --keep ""
refused "--lr '0x1p-3'" "${TRAIN[@]}" --lr 0x1p-3
refused "--lr 'inf'" "${TRAIN[@]}" --lr inf
refused "--momentum '1.5'" "${TRAIN[@]}" --momentum 1.5
refused "--mtbf 'nan'" "${TRAIN[@]}" --mtbf nan
refused "--ckpt-every '1.5'" "${TRAIN[@]}" --ckpt-every 1.5
refused "--hash-every '+5'" "${TRAIN[@]}" --hash-every +5

refused "-n '1.5'" "${RUN[@]}" -n 1.5 -- true
refused "--heartbeat-timeout '0x10'" "${RUN[@]}" --heartbeat-timeout 0x10 -- true
refused "--startup-timeout ' 5'" "${RUN[@]}" --startup-timeout " 5" -- true
refused "--failure-threshold '2.0'" "${RUN[@]}" --failure-threshold 2.0 -- true
refused "--max-restarts '-1'" "${RUN[@]}" --max-restarts -1 -- true
refused "--min-ranks '1e0'" "${RUN[@]}" --min-ranks 1e0 -- true
refused "--health-threshold '101'" "${RUN[@]}" --health-threshold 101 -- true
refused "--health-interval 'inf'" "${RUN[@]}" --health-interval inf -- true
refused "--sim-seed '1.5'" "${RUN[@]}" --sim-seed 1.5 -- true
refused "--sim-time-scale '0x10'" "${RUN[@]}" --sim-time-scale 0x10 -- true
refused "--sim-age '-1'" "${RUN[@]}" --sim-age -1 -- true
refused "--drain-probability '1.5'" "${RUN[@]}" --drain-probability 1.5 -- true

refused "--sim '1.5'" "${DOCTOR[@]}" --sim 1.5
refused "--seed '-1'" "${DOCTOR[@]}" --seed -1
refused "--seed '1e3'" "${DOCTOR[@]}" --seed 1e3
refused "--age 'nan'" "${DOCTOR[@]}" --age nan
refused "--samples '2.0'" "${DOCTOR[@]}" --samples 2.0
refused "--interval '0x1'" "${DOCTOR[@]}" --interval 0x1
refused "--threshold '100.5'" "${DOCTOR[@]}" --threshold 100.5
# the Slurm modes: one at a time, their options only with them, a node name that is one
refused "--slurm and --gres are two different jobs" "${DOCTOR[@]}" --slurm --node n1 --gres
refused "--json is not for --slurm or --gres" "${DOCTOR[@]}" --slurm --node n1 --json
refused "--dry-run and --scontrol go with --slurm" "${DOCTOR[@]}" --dry-run
refused "--node goes with --slurm or --gres" "${DOCTOR[@]}" --node n1
refused "node name 'a=b': not a Slurm node name" "${DOCTOR[@]}" --gres --node a=b
refused "node name 'a b': not a Slurm node name" "${DOCTOR[@]}" --slurm --node "a b"
refused "node name '-x': not a Slurm node name" "${DOCTOR[@]}" --slurm --node -x
if [[ -z ${SLURMD_NODENAME:-} && -z ${SLURM_JOB_NODELIST:-} && -z ${SLURM_NODELIST:-} ]]; then
  refused "--slurm needs the node's name" "${DOCTOR[@]}" --slurm
  refused "--hosts slurm:2: not inside a Slurm allocation" run --launcher srun --hosts slurm:2 \
    --listen 127.0.0.1:0 -- true
fi
refused "--slurm-drain goes with --launcher srun and --hosts" "${RUN[@]}" --slurm-drain -- true
refused "--hosts slurm:N" run --launcher srun --hosts slurm:0 --listen 127.0.0.1:0 -- true
# a --listen name that resolves to loopback (Debian's /etc/hosts: the host's own name) is one
here=$(hostname)
if [[ "$(getent ahostsv4 "$here" 2>/dev/null | awk 'NR == 1 { print $1 }')" == 127.* ]]; then
  refused "--listen $here:0 is a loopback address: host h1 cannot reach it" run --hosts h1:1 \
    --listen "$here:0" -- true
fi
refused "--rsh with --launcher srun" run --launcher srun --hosts 127.0.0.1:1 \
  --listen 127.0.0.1:0 --rsh ssh -- true
refused "--socket-node 'a/b': not a node name" agent --coordinator 127.0.0.1:1 --node 0 \
  --job-id 00 --watch --socket-node a/b

refused "--interval '0x10'" "${EXPORTER[@]}" --interval 0x10
refused "--sim ' 2'" "${EXPORTER[@]}" --sim " 2"
refused "--seed '1e3'" "${EXPORTER[@]}" --seed 1e3
refused "--age '1e7'" "${EXPORTER[@]}" --age 1e7
refused "--time-scale 'inf'" "${EXPORTER[@]}" --time-scale inf
refused "--threshold '-1'" "${EXPORTER[@]}" --threshold -1
refused "--listen '127.0.0.1:09258'" "${EXPORTER[@]}" --listen 127.0.0.1:09258

refused "--lock-clocks '1.5e3'" tune --lock-clocks 1.5e3
refused "--power-limit '0x64'" tune --power-limit 0x64
refused "--power-limit 'nan'" tune --power-limit nan

refused "--step ' 5'" ckpt export "$D" --step " 5" -o "$O/w.safetensors"
refused "--step '0x10'" ckpt export "$D" --step 0x10 -o "$O/w.safetensors"

refused "--window '1.5'" predict cmapss --data "$D" --window 1.5
refused "--seed '0x10'" predict cmapss --data "$D" --seed 0x10
refused "--lr 'inf'" predict cmapss --data "$D" --lr inf
refused "--ensemble ' 2'" predict cmapss --data "$D" --ensemble " 2"
refused "--sim '2.5'" predict dataset --sim 2.5 --hours 1 -o "$O/ds"
refused "--hours '0x1'" predict dataset --sim 2 --hours 0x1 -o "$O/ds"
refused "--val ' 0.1'" predict dataset --sim 2 --hours 1 --val " 0.1" -o "$O/ds"
refused "--seed '1.5'" predict dataset --sim 2 --hours 1 --seed 1.5 -o "$O/ds"
refused "--window '1e2'" predict train "$D" -o "$O/m.safetensors" --window 1e2
refused "--threshold '2'" predict eval "$D" --model "$F" --threshold 2

# --- paths of the wrong kind ----------------------------------------------------------------
refused "--ckpt-dir /proc/version:" "${TRAIN[@]}" --ckpt-dir /proc/version
refused "--ckpt-dir $F/x:" "${TRAIN[@]}" --ckpt-dir "$F/x"
refused "--init $D:" "${TRAIN[@]}" --init "$D"
refused "--init $M:" "${TRAIN[@]}" --init "$M"
refused "--data $M:" train --data "$M"
refused "--data $F:" train --data "$F"
refused "--save $O:" "${TRAIN[@]}" --save "$O"
refused "--save $M/w.safetensors:" "${TRAIN[@]}" --save "$M/w.safetensors"
refused "--metrics-json $O:" "${TRAIN[@]}" --metrics-json "$O"
refused "--loss-log $F/loss:" "${TRAIN[@]}" --loss-log "$F/loss"

# an output never goes into a checkpoint store: it would replace latest or a checkpoint
# (--save over the newest checkpoint, --metrics-json over latest were taken)
S=$W/store
mkdir -p "$S"
printf 'ckpt-000000000002.safetensors\n' >"$S/latest"
printf 'x' >"$S/ckpt-000000000002.safetensors"
refused "is a checkpoint store" "${TRAIN[@]}" --save "$S/ckpt-000000000002.safetensors"
refused "is a checkpoint store" "${TRAIN[@]}" --metrics-json "$S/latest"
refused "is a checkpoint store" "${TRAIN[@]}" --loss-log "$S/loss.csv"
refused "is a checkpoint store" "${RUN[@]}" --summary-json "$S/latest" -- true
refused "is a checkpoint store" "${RUN[@]}" --events "$S/events.jsonl" -- true

# under a supervisor the directory comes from RK_CKPT_DIR: the same check, naming it
(cd "$W" && RK_CKPT_DIR=/proc/version timeout 20 "$RK" "${TRAIN[@]}" >"$work/logs/out" \
  2>"$work/logs/err")
rc=$?
[[ $rc -eq 2 ]] && grep -qF "rk train: RK_CKPT_DIR /proc/version: is a regular file, not a directory" "$work/logs/err" \
  && ok "RK_CKPT_DIR=/proc/version rk train -> 2" \
  || bad "RK_CKPT_DIR=/proc/version rk train: exit $rc: $(head -1 "$work/logs/err")"

refused "--ckpt-dir /proc/version:" "${RUN[@]}" --ckpt-dir /proc/version -- true
refused "has an empty item" "${RUN[@]}" --devices 0,,1 -- true
refused "has an empty item" "${RUN[@]}" --devices 0, -- true
refused "--events $O:" "${RUN[@]}" --events "$O" -- true
refused "--summary-json $M/s.json:" "${RUN[@]}" --summary-json "$M/s.json" -- true
refused "--predictor $D:" "${RUN[@]}" --health sim --predictor "$D" -- true

# a job across hosts: its flags (nothing is started: the checks come first)
H=(run --hosts h1:2,h2:2)
refused "--hosts needs --listen" "${H[@]}" -- true
refused "--listen: '10.0.0.1' is not HOST:PORT" "${H[@]}" --listen 10.0.0.1 -- true
refused "not a wildcard" "${H[@]}" --listen 0.0.0.0:0 -- true
refused "is a loopback address: host h1" "${H[@]}" --listen 127.0.0.1:0 -- true
refused "-n 9: the hosts have 4 slots" "${H[@]}" -n 9 --listen 10.0.0.1:0 -- true
refused "--devices with --hosts" "${H[@]}" --devices 0,1 --listen 10.0.0.1:0 -- true
refused "--health auto with --hosts: give nvml or sim" "${H[@]}" --health auto --listen 10.0.0.1:0 -- true
printf 'not a model\n' >"$work/garbage.model"
refused "--predictor $work/garbage.model: " "${H[@]}" --health sim --predictor "$work/garbage.model" --listen 10.0.0.1:0 -- true
# the agent's health flags
AG=(agent --coordinator 10.0.0.1:7 --node 0 --job-id 00112233445566778899aabbccddeeff)
refused "--health needs --devices N" "${AG[@]}" --health sim
refused "--devices, --predictor and --sim-* are for --health" "${AG[@]}" --sim-seed 3
refused "--sim-* options need --health sim" "${AG[@]}" --devices 2 --health nvml --sim-age 10
refused "--health 'auto' is not nvml or sim" "${AG[@]}" --devices 2 --health auto
refused "--sim-gpus 3: the fleet has no GPU 3" "${AG[@]}" --devices 2 --health sim --sim-first 2 --sim-gpus 3
refused "entry 2 is empty" run --hosts h1:2,,h2 --listen 10.0.0.1:0 -- true
refused "twice" run --hosts h1:2 --spare-hosts H1:2 --listen 10.0.0.1:0 -- true
refused "hostfile $D" run --hostfile "$D" --listen 10.0.0.1:0 -- true
refused "--spare-hosts needs --hosts" run --spare-hosts h1:2 --listen 10.0.0.1:0 -- true
refused "not an address of this host" "${H[@]}" --listen 10.255.255.254:0 --rsh true -- true

# an --rsh that cannot run on any host: bad usage, at once (not after --startup-timeout)
LH=(run --quiet --hosts 127.0.0.1:1,127.0.0.2:1 --listen 127.0.0.1:0 --startup-timeout 60)
t0=$SECONDS
(cd "$W" && timeout 30 "$RK" "${LH[@]}" --rsh /nonexistent/ssh -- true </dev/null >"$work/logs/out" 2>"$work/logs/err")
rc=$?
[[ $rc -eq 2 ]] && grep -q "rsh '/nonexistent/ssh' cannot be run" "$work/logs/err" && ((SECONDS - t0 < 20)) \
  && ok "rk run --hosts with an --rsh that cannot run: exit 2 in $((SECONDS - t0)) s" \
  || bad "--rsh /nonexistent/ssh: exit $rc after $((SECONDS - t0)) s: $(tail -2 "$work/logs/err")"
# SIGTERM while the agents start (an --rsh that never starts one): interrupted, exit 130. The
# signal goes once rk run has run the --rsh (it installs its handlers before it starts any
# agent): the script says so in hang-rsh.started, then hangs.
# shellcheck disable=SC2016 # the script's own $0
printf '#!/bin/sh\n: >"$0.started"\nexec sleep 60\n' >"$work/hang-rsh"
chmod +x "$work/hang-rsh"
(cd "$W" && exec "$RK" "${LH[@]}" --rsh "$work/hang-rsh" -- true </dev/null >"$work/logs/out" 2>"$work/logs/err") &
sup=$!
pids+=("$sup")
for ((i = 0; i < 600; i++)); do
  [[ -e $work/hang-rsh.started ]] || ! kill -0 "$sup" 2>/dev/null && break
  sleep 0.05
done
[[ -e $work/hang-rsh.started ]] || bad "rk run did not run its --rsh within 30 s: $(tail -2 "$work/logs/err")"
kill -TERM "$sup"
wait "$sup"
rc=$?
[[ $rc -eq 130 ]] && grep -q "interrupted while the agents were starting" "$work/logs/err" \
  && ok "rk run --hosts interrupted while the agents start: exit 130" \
  || bad "SIGTERM while the agents start: exit $rc: $(tail -2 "$work/logs/err")"

refused "--textfile-dir /nonexistent:" "${DOCTOR[@]}" --textfile-dir /nonexistent
refused "--textfile-dir $F:" "${DOCTOR[@]}" --textfile-dir "$F"
refused "--predictor $D:" "${DOCTOR[@]}" --predictor "$D"

refused "--textfile-dir /nonexistent:" "${EXPORTER[@]}" --textfile-dir /nonexistent
refused "--textfile-dir $F:" "${EXPORTER[@]}" --textfile-dir "$F"
refused "--predictor $D:" "${EXPORTER[@]}" --predictor "$D"

refused "--plugin-dir $F:" device-plugin --sim 1 --plugin-dir "$F"
refused "--textfile-dir /nonexistent:" device-plugin --sim 1 --plugin-dir "$D" --textfile-dir /nonexistent
refused "--interval '0.01'" device-plugin --sim 1 --plugin-dir "$D" --interval 0.01
refused "--sim '1.5'" device-plugin --sim 1.5 --plugin-dir "$D"

refused "-o $O:" ckpt export "$D" -o "$O"
refused "-o $M/w.safetensors:" ckpt export "$D" -o "$M/w.safetensors"

refused "-o /proc/version:" predict dataset --sim 2 --hours 1 -o /proc/version
refused "-o $O:" predict train "$D" -o "$O"
refused "--model $D:" predict eval "$D" --model "$D"

# --- what stays accepted --------------------------------------------------------------------
for cmd in train ckpt "ckpt ls" "ckpt verify" "ckpt export" run agent doctor tune exporter device-plugin predict plan \
  "predict cmapss" "predict dataset" "predict train" "predict eval"; do
  # shellcheck disable=SC2086 # the words of $cmd are the subcommand
  "$RK" $cmd --help >"$work/logs/out" 2>"$work/logs/err"
  rc=$?
  [[ $rc -eq 0 ]] && grep -q "^usage: rk ${cmd%% *}" "$work/logs/out" \
    && ok "rk $cmd --help" || bad "rk $cmd --help: exit $rc: $(head -c 200 "$work/logs/err")"
done
# a seed is any number 0..2^63-1, in every subcommand (it is written into JSON, read as int64)
"$RK" doctor --sim 2 --samples 1 --interval 0 --seed 9223372036854775807 --json \
  >"$work/logs/out" 2>"$work/logs/err"
rc=$?
[[ $rc -ne 2 ]] && ok "rk doctor --seed 2^63-1 is a seed (exit $rc)" \
  || bad "rk doctor --seed 2^63-1: $(head -1 "$work/logs/err")"
# a duration takes its units in every subcommand
"$RK" doctor --sim 1 --samples 2 --interval 10ms --json >"$work/logs/out" 2>"$work/logs/err"
rc=$?
[[ $rc -ne 2 ]] && ok "rk doctor --interval 10ms (exit $rc)" \
  || bad "rk doctor --interval 10ms: $(head -1 "$work/logs/err")"
it_finish
