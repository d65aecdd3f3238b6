#!/usr/bin/env bash
# The checkpoint store refuses to lose data, as a user meets it (docs/checkpoint.md):
#   - one writer per --ckpt-dir: a standalone `rk train` and `rk run` hold DIR/.lock; a second
#     job on the directory is refused with exit 2 naming the holder's pid; the kernel frees
#     the lock of a holder killed with SIGKILL; workers of `rk run` do not take it themselves;
#   - a checkpoint that exists but cannot be read (mode 000, run as nobody) is an error: the
#     run refuses to start, `latest` and the directory stay as they were;
#   - a NaN in the newest checkpoint's weights: --resume falls back to the previous one
#     (reported) and ends with the weights of an uninterrupted run; --init refuses NaN weights.
#   - a resume that falls back past a bad checkpoint and saves its step again moves the bad file
#     aside (ckpt-<step>.safetensors.bad-<seconds>, bytes unchanged) instead of replacing it;
#     `rk ckpt ls` lists it, the new checkpoint of that step is good and `latest` names it.
# Skips (77) without Fashion-MNIST; the parts that need mpirun or privileges skip alone.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_need_data
it_init it_ckpt_store
python3 "$RK_SRC/tests/make_subset.py" "$DATA" "$work/sub" 2000 200 || { bad "make subset"; exit 1; }
targs=(--model mlp --epochs 20 --no-eval --threads 1 --seed 3)
train=("$RK" train "${targs[@]}" --data "$work/sub")
mk=(python3 "$RK_SRC/tests/ckpt_mk.py")
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none

# every file but the lock file, whose content is the pid of its last holder
state() { (cd "$1" && find . -type f ! -name .lock -print0 | sort -z | xargs -0 -r sha256sum); }

# --- one writer per directory: a standalone rk train holds the lock ---
d="$work/lock"
"${train[@]}" --max-steps 1000000 --ckpt-dir "$d" --ckpt-every 100000 >"$work/holder.log" 2>&1 &
holder=$!
pids+=("$holder")
if wait_for '[[ "$(cat "$d/.lock" 2>/dev/null)" == "$holder" ]]' 60; then
  ok "rk train holds $d/.lock (pid $holder in it)"
else bad "no lock file with pid $holder: $(cat "$d/.lock" 2>&1) $(tail -2 "$work/holder.log")"; fi
"${train[@]}" --max-steps 10 --ckpt-dir "$d" --resume >"$work/second.log" 2>&1
rc=$?
[[ $rc -eq 2 ]] && grep -q "pid $holder holds" "$work/second.log" &&
  ok "a second rk train on the directory: exit 2, $(grep -m1 -o 'another job.*' "$work/second.log" | cut -c1-90)" ||
  bad "second rk train: exit $rc $(tail -2 "$work/second.log")"
if command -v mpirun >/dev/null; then
  "$RK" run -n 1 --ckpt-dir "$d" --quiet -- true >"$work/run2.log" 2>&1
  rc=$?
  [[ $rc -eq 2 ]] && grep -q "pid $holder holds" "$work/run2.log" &&
    ok "rk run on the directory of a running rk train: exit 2 naming pid $holder" ||
    bad "rk run on a held directory: exit $rc $(tail -2 "$work/run2.log")"
fi
kill -9 "$holder"
wait "$holder" 2>/dev/null
"${train[@]}" --max-steps 20 --ckpt-dir "$d" --resume >"$work/after.log" 2>&1 &&
  ok "after SIGKILL of the holder the lock is free: the next run starts" ||
  bad "after SIGKILL: $(tail -2 "$work/after.log")"
[[ -f "$d/.lock" && -f "$d/latest" ]] && ok "the lock file stays beside the checkpoints" ||
  bad "lock file or latest missing: $(ls -a "$d")"

# --- rk run holds the lock for its whole job; its workers do not take it ---
if command -v mpirun >/dev/null; then
  d="$work/runlock"
  py=(python3 "$RK_SRC/examples/python_worker.py" --steps 100000 --sleep 0.02 --ckpt-every 10)
  "$RK" run -n 1 --ckpt-dir "$d" --quiet -- "${py[@]}" >"$work/sup.log" 2>&1 &
  sup=$!
  pids+=("$sup")
  if wait_for '[[ "$(cat "$d/.lock" 2>/dev/null)" == "$sup" ]]' 60; then
    ok "rk run holds $d/.lock (pid $sup)"
  else bad "rk run: no lock with pid $sup: $(cat "$d/.lock" 2>&1)"; fi
  "${train[@]}" --max-steps 10 --ckpt-dir "$d" >"$work/t.log" 2>&1
  rc=$?
  [[ $rc -eq 2 ]] && grep -q "pid $sup holds" "$work/t.log" &&
    ok "rk train on rk run's directory: exit 2 naming pid $sup" ||
    bad "rk train on rk run's dir: exit $rc $(tail -2 "$work/t.log")"
  "$RK" run -n 1 --ckpt-dir "$d" --quiet -- true >"$work/r.log" 2>&1
  rc=$?
  [[ $rc -eq 2 ]] && grep -q "pid $sup holds" "$work/r.log" &&
    ok "a second rk run on the directory: exit 2 naming pid $sup" ||
    bad "second rk run: exit $rc $(tail -2 "$work/r.log")"
  kill -INT "$sup"
  wait "$sup" 2>/dev/null
  "$RK" run -n 1 --ckpt-dir "$work/job" --quiet --heartbeat-timeout 30 -- \
    "${train[@]}" --max-steps 30 --ckpt-every 10 >"$work/job.log" 2>&1
  rc=$?
  [[ $rc -eq 0 && -f "$work/job/ckpt-000000000030.safetensors" ]] &&
    ok "rk train as rk run's worker checkpoints into the directory rk run holds" ||
    bad "supervised rk train: exit $rc $(tail -3 "$work/job.log")"
else
  echo "skip - mpirun not found: rk run's lock not tested"
fi

# --- a checkpoint that exists but cannot be read is an error, never "none yet" ---
# As root the checks run as nobody (permissions apply to it), everything they use in
# $nobody_dir (itlib.sh): a copy of rk, the data, the stores; else as this user, in $work.
u=$work urk=$RK asuser=()
if [[ $(id -u) -ne 0 ]]; then :
elif it_nobody_dir; then
  u=$nobody_dir urk=$nobody_dir/rk asuser=(as_nobody)
  cp "$RK" "$urk" && cp -r "$work/sub" "$u/sub" && chmod -R a+rX "$u" || bad "copies for nobody"
else
  u=
fi
if [[ -n $u ]]; then
  utrain=("$urk" train "${targs[@]}" --data "$u/sub")
  "${utrain[@]}" --max-steps 40 --ckpt-every 20 --ckpt-dir "$u/unr" >/dev/null 2>&1 &&
    "${utrain[@]}" --max-steps 20 --ckpt-every 20 --ckpt-dir "$u/unr1" >/dev/null 2>&1 ||
    bad "runs for the unreadable checks"
  if [[ $(id -u) -eq 0 ]]; then chown -R 65534:65534 "$u/unr" "$u/unr1"; fi
  chmod 000 "$u/unr/ckpt-000000000040.safetensors" "$u/unr1/ckpt-000000000020.safetensors"
fi
who=$( ((${#asuser[@]})) && echo nobody || id -un)
if [[ -z $u ]]; then :
elif "${asuser[@]}" cat "$u/unr/ckpt-000000000040.safetensors" >/dev/null 2>&1; then
  echo "skip - permissions do not apply to $who here (it reads a mode 000 file): unreadable checkpoints not tested"
elif ! "${asuser[@]}" "$urk" --help >"$work/uh.out" 2>&1; then
  bad "$who cannot run $urk: $(head -c 300 "$work/uh.out")"
else
  before=$(state "$u/unr")
  "${asuser[@]}" "${utrain[@]}" --max-steps 60 --ckpt-every 20 --ckpt-dir "$u/unr" --resume >"$work/u.log" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] && grep -q "ckpt-000000000040.safetensors.*Permission denied" "$work/u.log" &&
    ! grep -q "resuming from" "$work/u.log" &&
    ok "--resume with an unreadable newest checkpoint refuses to start (exit $rc): $(grep -m1 -o 'ckpt-000000000040.*denied' "$work/u.log")" ||
    bad "unreadable newest: exit $rc $(tail -3 "$work/u.log")"
  [[ "$(cat "$u/unr/latest")" == "ckpt-000000000040.safetensors" && "$(state "$u/unr")" == "$before" ]] &&
    ok "latest and every checkpoint are as they were" || bad "the directory changed: $(ls "$u/unr" | tr '\n' ' ')"
  "${asuser[@]}" "$urk" ckpt verify "$u/unr" >"$work/uv.out" 2>"$work/uv.err"
  rc=$?
  [[ $rc -eq 1 ]] && grep -q "a resume would stop: .*ckpt-000000000040.*Permission denied" "$work/uv.err" &&
    ok "rk ckpt verify: exit 1, a resume would stop (no fallback past it)" ||
    bad "verify of an unreadable latest: exit $rc $(cat "$work/uv.err")"
  "${asuser[@]}" "$urk" ckpt ls "$u/unr" >"$work/ul.out" 2>&1
  grep -q "ckpt-000000000040.safetensors .*UNREADABLE: .*Permission denied" "$work/ul.out" &&
    ok "rk ckpt ls marks it UNREADABLE" || bad "ls of an unreadable checkpoint: $(cat "$work/ul.out")"
  for mode in --resume ""; do
    "${asuser[@]}" "${utrain[@]}" --max-steps 40 --ckpt-dir "$u/unr1" $mode >"$work/u1.log" 2>&1
    rc=$?
    [[ $rc -ne 0 ]] && grep -q "Permission denied" "$work/u1.log" && ! grep -q "starting from step 0" "$work/u1.log" &&
      [[ ! -e "$u/unr1/ckpt-000000000040.safetensors" ]] &&
      ok "the only checkpoint unreadable, ${mode:-fresh start}: refused (exit $rc), not 'none yet'" ||
      bad "only checkpoint unreadable ${mode:-fresh}: exit $rc $(tail -3 "$work/u1.log")"
  done
fi

# --- non-finite weights: --resume falls back, --init refuses ---
"${train[@]}" --max-steps 50 --metrics-json "$work/full.json" >/dev/null 2>&1 || bad "uninterrupted run"
d="$work/nan"
"${train[@]}" --max-steps 40 --ckpt-every 20 --ckpt-dir "$d" >/dev/null 2>&1 || bad "run for the NaN checks"
"${mk[@]}" --set "$d/ckpt-000000000040.safetensors" model.fc1.bias 3 nan
"${train[@]}" --max-steps 50 --ckpt-every 20 --ckpt-dir "$d" --resume --metrics-json "$work/nan.json" \
  >"$work/nan.log" 2>&1
rc=$?
[[ $rc -eq 0 ]] && grep -q "ckpt-000000000040.safetensors: tensor 'model.fc1.bias': element 3 is NaN" "$work/nan.log" &&
  grep -q "resuming from $d/ckpt-000000000020.safetensors" "$work/nan.log" &&
  ok "--resume skips the checkpoint with a NaN weight (reported) and resumes from step 20" ||
  bad "NaN resume: exit $rc $(head -5 "$work/nan.log")"
[[ "$(json "$work/nan.json" weights_xxh64 2>/dev/null)" == "$(json "$work/full.json" weights_xxh64)" ]] &&
  ok "and ends with the uninterrupted run's weights" || bad "NaN resume: other weights"
[[ -f "$d/ckpt-000000000040.safetensors" ]] && ok "the NaN checkpoint is kept as evidence" ||
  bad "the NaN checkpoint was deleted"
"$RK" ckpt export "$d" --step 20 -o "$work/w.safetensors" >/dev/null 2>&1 || bad "export"
python3 - "$work/w.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
n = struct.unpack_from("<Q", b)[0]; h = json.loads(b[8:8 + n])
struct.pack_into("<f", b, 8 + n + h["fc2.weight"]["data_offsets"][0] + 4 * 5, float("inf"))
open(p, "wb").write(b)
PY
"$RK" train --model mlp --init "$work/w.safetensors" --epochs 0 --data "$work/sub" >"$work/init.log" 2>&1
rc=$?
[[ $rc -eq 2 ]] && grep -q "tensor 'fc2.weight': element 5 is +inf" "$work/init.log" &&
  ok "--init of weights with an infinity: exit 2 naming tensor and element" ||
  bad "--init inf: exit $rc $(tail -2 "$work/init.log")"

# --- a save over a bad checkpoint of the same step keeps the bad one as evidence ---
d="$work/aside"
"${train[@]}" --max-steps 6 --ckpt-every 2 --ckpt-dir "$d" >/dev/null 2>&1 || bad "run for the aside checks"
"${mk[@]}" --set "$d/ckpt-000000000006.safetensors" optim.v.fc1.weight 0 nan
badsum=$(sha256sum <"$d/ckpt-000000000006.safetensors")
"${train[@]}" --max-steps 8 --ckpt-every 2 --ckpt-dir "$d" --resume >"$work/aside.log" 2>&1
rc=$?
[[ $rc -eq 0 ]] && grep -q "resuming from $d/ckpt-000000000004.safetensors" "$work/aside.log" &&
  ok "--resume past a bad step 6 resumes from step 4" || bad "aside resume: exit $rc $(head -5 "$work/aside.log")"
aside=("$d"/ckpt-000000000006.safetensors.bad-*)
[[ ${#aside[@]} -eq 1 && -f "${aside[0]}" && "$(sha256sum <"${aside[0]}")" == "$badsum" ]] &&
  ok "the bad step 6 survives, bytes unchanged, as $(basename "${aside[0]}")" ||
  bad "the bad step 6 was lost: $(ls "$d" | tr '\n' ' ')"
"$RK" ckpt verify --all "$d" >"$work/av.out" 2>&1 && [[ "$(cat "$d/latest")" == "ckpt-000000000008.safetensors" ]] &&
  [[ "$(sha256sum <"$d/ckpt-000000000006.safetensors")" != "$badsum" ]] &&
  ok "the new step 6 and step 8 verify, latest names step 8" || bad "after the aside save: $(cat "$work/av.out")"
"$RK" ckpt ls "$d" >"$work/al.out" 2>&1
grep -q "moved aside" "$work/al.out" && grep -q "$(basename "${aside[0]}")  step 6" "$work/al.out" &&
  ok "rk ckpt ls lists it: $(grep -m1 -o 'ckpt-000000000006.safetensors.bad-.*' "$work/al.out")" ||
  bad "rk ckpt ls does not list the aside file: $(cat "$work/al.out")"

it_finish
