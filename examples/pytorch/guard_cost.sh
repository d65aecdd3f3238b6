#!/usr/bin/env bash
# What rekindle.torch's guards cost per step (docs/pytorch.md): 2 ranks of the example, gloo
# on CPU, 1 thread each, started directly (no rk run: supervision's cost is bench/'s), each
# setting ROUNDS times in alternation; the best steps/s and the least CPU time a step of rank
# 0 (less sensitive to other load on the machine than the wall clock) of each.
#   examples/pytorch/guard_cost.sh [STEPS] [ROUNDS] [GLOBAL BATCH]
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
py=$("$here/../../tests/pyfind.sh" torch xxhash numpy) || { echo "$py"; exit 77; }
steps=${1:-400} rounds=${2:-3} batch=${3:-64}
export PYTHONPATH="$here/../../python${PYTHONPATH:+:$PYTHONPATH}"
common=(--steps "$steps" --subset $((batch * 64)) --batch "$batch")
configs=("plain DDP (plain_ddp.py)|plain_ddp.py"
         "rekindle.torch, guards off|train_fashion_mnist.py --guard off"
         "guards on, no replica hash|train_fashion_mnist.py --hash-every 0"
         "guards on, replica hash every 10|train_fashion_mnist.py --hash-every 10"
         "guards on, replica hash every step|train_fashion_mnist.py --hash-every 1")
declare -A best cpu
two_ranks() {
  local port=$((20000 + RANDOM % 20000)) r p out=()
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$py" "$@" 2>/dev/null &
    out+=($!)
  done
  for p in "${out[@]}"; do wait "$p"; done
}
for ((k = 0; k < rounds; k++)); do
  for c in "${configs[@]}"; do
    name=${c%%|*} args=${c#*|}
    # shellcheck disable=SC2086
    line=$(two_ranks "$here"/$args "${common[@]}" | grep 'train loop')
    sps=$(sed -n 's/.*(\([0-9.]*\) steps\/s.*/\1/p' <<<"$line")
    ms=$(sed -n 's/.*, \([0-9.]*\) ms CPU.*/\1/p' <<<"$line")
    if [[ -z "${best[$name]:-}" ]] || awk "BEGIN{exit !($sps > ${best[$name]})}"; then best[$name]=$sps; fi
    if [[ -z "${cpu[$name]:-}" ]] || awk "BEGIN{exit !($ms < ${cpu[$name]})}"; then cpu[$name]=$ms; fi
  done
done
base=${best["plain DDP (plain_ddp.py)"]} cbase=${cpu["plain DDP (plain_ddp.py)"]}
printf '%-40s %10s %8s %14s %8s\n' setting "steps/s" "vs plain" "CPU ms/step" "vs plain"
for c in "${configs[@]}"; do
  name=${c%%|*}
  printf '%-40s %10s %8s %14s %8s\n' "$name" "${best[$name]}" \
    "$(awk "BEGIN{printf \"%+.1f%%\", (${best[$name]} / $base - 1) * 100}")" "${cpu[$name]}" \
    "$(awk "BEGIN{printf \"%+.1f%%\", (${cpu[$name]} / $cbase - 1) * 100}")"
done
