#!/usr/bin/env bash
# rk burn without a GPU (this machine's case; a GPU machine runs scripts/gpu-check.sh): --help
# exits 0; each bad flag exits 2 naming the flag, before any GPU work and without touching the
# state file; with no CUDA driver (RK_CUDA_LIB pointed at nothing) one clear line and exit 1,
# the state file unchanged.
set -u
. "$(dirname "$0")/itlib.sh"
it_init burn
state=$work/burn.json
printf '{"format": "rekindle-burn-state", "gpus": {}, "version": 1}\n' >"$state"
sum0=$(sha256sum "$state")
export RK_BURN_STATE=$state

"$RK" burn --help >"$work/help" 2>&1 && grep -q -- '--duration' "$work/help" &&
  ok "--help exits 0 and lists the flags" || bad "--help"

check_usage() { # FLAG-ARGS... ; WORD the message must name
  local want=$1
  shift
  "$RK" burn "$@" >"$work/out" 2>&1
  local rc=$?
  if [[ $rc == 2 ]] && grep -q -- "$want" "$work/out"; then
    ok "rk burn $* exits 2 naming $want"
  else
    bad "rk burn $* exited $rc: $(head -1 "$work/out")"
  fi
}
check_usage --memory --memory 0%
check_usage --memory --memory 100%
check_usage --memory --memory lots
check_usage --duration --duration 0s
check_usage --duration --duration -5m
check_usage --gpus --gpus 1,,2
check_usage --gpus --gpus a
check_usage --seed --seed -1
check_usage --state --state "$work/no/such/dir/burn.json"
check_usage unexpected --duration 1m extra

RK_CUDA_LIB=$work/no-libcuda.so.1 "$RK" burn --duration 1s >"$work/out" 2>&1
rc=$?
if [[ $rc == 1 ]] && [[ $(wc -l <"$work/out") == 1 ]] && grep -q 'no CUDA driver' "$work/out"; then
  ok "no driver: one line, exit 1"
else
  bad "no driver: rc $rc, $(cat "$work/out")"
fi
[[ $(sha256sum "$state") == "$sum0" ]] && ok "state file unchanged" || bad "state file changed"
it_finish
