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

# End to end on a simulated GPU: tests/fake_cuda.c runs the kernels by their host references;
# fake_nvml gives it a UUID (bus 01:00.0). Faults injected with FAKE_CUDA_FAULT.
fake_cuda=$RK_BUILD/tests/libfake_cuda.so fake_nvml=$RK_BUILD/tests/libfake_nvml.so
if [[ ! -f $fake_cuda || ! -f $fake_nvml ]]; then
  bad "fake libraries missing ($fake_cuda, $fake_nvml)"
  it_finish
  exit
fi
export XDG_CACHE_HOME=$work/cache RK_CUDA_LIB=$fake_cuda RK_NVML_LIB=$fake_nvml
key=GPU-00000000-1070-0000-0000-000000000000
burn() { # NAME FAULT EXPECTED-RC: run rk burn --json, keep its output in $work/NAME.json
  FAKE_CUDA_FAULT=$2 "$RK" burn --duration 2s --json >"$work/$1.json" 2>"$work/$1.err"
  local rc=$?
  [[ $rc == "$3" ]] && ok "$1: exit $rc" || bad "$1: exit $rc, wanted $3: $(head -3 "$work/$1.err")"
}
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['gpus'][0][sys.argv[2]])" "$@"; }
stated() { python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['gpus'][sys.argv[2]]; print(r['ok'], r['failed'])" "$state" "$key"; }

burn clean "" 0
[[ $(field "$work/clean.json" name) == *Simulated* ]] && ok "the simulated GPU says it is simulated" || bad "name"
[[ $(field "$work/clean.json" tuned_now) == True ]] && ok "first run autotunes" || bad "no tune"
ls "$work/cache/rekindle/"sgemm-*-sm80.tune >/dev/null 2>&1 && ok "autotune cache written" || bad "no tune cache"
(( $(field "$work/clean.json" rounds) >= 1 )) && ok "SGEMM rounds compared" || bad "no round"
[[ $(stated) == "True " ]] && ok "clean burn recorded OK under the UUID" || bad "record: $(stated)"

burn sgemm sgemm:2 1
[[ $(field "$work/sgemm.json" tuned_now) == False ]] && ok "second run uses the cache" || bad "retuned"
[[ $(field "$work/sgemm.json" failed) == "sgemm: "*" elements wrong in copies 2" ]] &&
  ok "a flipped element in copy 2 is FAULTY and named" || bad "sgemm fault: $(field "$work/sgemm.json" failed)"
[[ $(stated) == "False sgemm: "* ]] && ok "FAULTY recorded, replacing OK" || bad "record: $(stated)"

burn memory memory:64 1
[[ $(field "$work/memory.json" failed) == *"address lines"*"words wrong (first at word 64)"* ]] &&
  ok "a bad memory word is FAULTY, its test and word named" || bad "memory fault: $(field "$work/memory.json" failed)"
it_finish
