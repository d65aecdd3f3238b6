#!/usr/bin/env bash
# Integration test of `rk ckpt ls|verify|export` on real files: checkpoints are written by an
# independent Python implementation of docs/checkpoint.md (tests/ckpt_mk.py, so the C reader
# is checked against the documented format, not against itself), then corrupted, truncated,
# mislabelled and given non-finite weights; export refuses to write into a store.
# Checks exit codes (0 ok, 1 check failed, 2 usage/input), that messages name the file and
# tensor or field, the fallback, that nothing is ever deleted, and that an exported model loads
# with `rk train --init` (when Fashion-MNIST is installed). Needs RK, RK_SRC, RK_TMP.
set -u
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_ckpt_cli

# run NAME WANT_STATUS ARGS...: run rk, keep stdout/stderr in $work/out, $work/err.
run() {
  local name=$1 want=$2; shift 2
  "$RK" "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  if [[ $rc -eq $want ]]; then return 0; fi
  bad "$name (exit $rc, want $want; stderr: $(head -c 400 "$work/err"))"
  return 1
}
# expect NAME WANT_STATUS FILE PATTERN ARGS...: exit status and a fixed string in out or err.
expect() {
  local name=$1 want=$2 where=$3 pattern=$4; shift 4
  run "$name" "$want" "$@" || return
  if grep -qF -- "$pattern" "$work/$where"; then ok "$name"
  else bad "$name ($where lacks '$pattern': $(head -c 400 "$work/$where"))"; fi
}
# A fingerprint of every file in a directory: name, size, content hash.
state() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 -r sha256sum); }

mk=(python3 "$RK_SRC/tests/ckpt_mk.py")

ck="$work/ckpts"
mkdir -p "$ck"
"${mk[@]}" "$ck" 100 >/dev/null &&
  h200=$("${mk[@]}" "$ck" 200) &&
  "${mk[@]}" "$ck" 300 --latest >/dev/null || { bad "python writer"; exit 1; }

# --- usage and exit statuses ---
expect "rk --help lists ckpt" 0 out "ckpt" --help
expect "rk ckpt --help" 0 out "rk ckpt export DIR [--step S] -o OUT.safetensors" ckpt --help
for sub in ls verify export; do
  expect "rk ckpt $sub --help" 0 out "usage: rk ckpt $sub" ckpt $sub --help
done
expect "no subcommand" 2 err "missing command" ckpt
expect "unknown subcommand" 2 err "unknown command 'frob'" ckpt frob
expect "ls without DIR" 2 err "missing DIR" ckpt ls
expect "ls of a missing dir" 2 err "$work/nope" ckpt ls "$work/nope"
expect "verify of a missing dir" 2 err "$work/nope" ckpt verify "$work/nope"
expect "verify of a file" 2 err "not a directory" ckpt verify "$RK_SRC/tests/ckpt_mk.py"
expect "export without -o" 2 err "missing -o" ckpt export "$ck"
expect "export with a bad --step" 2 err "--step 'abc'" ckpt export "$ck" --step abc -o "$work/w"
expect "ls with a stray argument" 2 err "unexpected argument" ckpt ls "$ck" more
expect "unknown option" 2 err "unknown option" ckpt ls --bogus "$ck"

before=$(state "$ck")
# --- good directory ---
expect "ls lists the checkpoints" 0 out "ckpt-000000000300.safetensors" ckpt ls "$ck"
if [[ $(grep -c "  ok$" "$work/out") -eq 3 ]] && grep -q "300 .* latest  ok$" "$work/out"; then
  ok "ls: three valid, latest marked"
else bad "ls table: $(cat "$work/out")"; fi
expect "verify a good latest" 0 out "ok (latest): step 300" ckpt verify "$ck"
expect "verify --all on a good dir" 0 out "ckpt-000000000100.safetensors: ok" ckpt verify --all "$ck"

# --- export ---
expect "export --step 200" 0 out "(step 200)" ckpt export "$ck" --step 200 -o "$work/w200.safetensors"
if python3 "$RK_SRC/tests/st_read.py" "$work/w200.safetensors" --meta >"$work/st.txt" 2>&1 &&
   grep -q "^fc1.weight F32 \[256,784\]" "$work/st.txt" &&
   grep -q "^meta format rekindle-weights-1" "$work/st.txt" &&
   grep -q "^meta model mlp" "$work/st.txt" && ! grep -q "optim\|rng\|model\." "$work/st.txt"; then
  ok "export: plain weights, prefix stripped, optimiser and RNG state left out"
else bad "export content: $(head -12 "$work/st.txt")"; fi
expect "export of the newest" 0 out "(step 300)" ckpt export "$ck" -o "$work/w300.safetensors"
expect "export of a missing step" 2 err "no checkpoint of step 250" ckpt export "$ck" --step 250 -o "$work/x"
if [[ -e "$DATA/t10k-images-idx3-ubyte.gz" || -e "$DATA/t10k-images-idx3-ubyte" ]]; then
  if "$RK" train --model mlp --init "$work/w200.safetensors" --epochs 0 --threads 2 --data "$DATA" \
       --metrics-json "$work/m.json" >"$work/train.log" 2>&1 &&
     [[ "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["weights_xxh64"])' \
           "$work/m.json")" == "$h200" ]]; then
    ok "rk train --init loads the exported weights bit for bit (xxh64 $h200)"
  else bad "rk train --init of the export: $(tail -3 "$work/train.log")"; fi
  expect "--init of the export into another model" 2 err "mlp" train --model cnn-small \
    --init "$work/w200.safetensors" --epochs 0 --data "$DATA"
else
  echo "# Fashion-MNIST not found in $DATA: skipping the rk train --init check"
fi
"${mk[@]}" "$work" 7 --tiny --config '{"batch":8}' >/dev/null
mkdir -p "$work/nomodel" && mv "$work/ckpt-000000000007.safetensors" "$work/nomodel/"
expect "export without a model name in the config" 2 err 'no "model" string' \
  ckpt export "$work/nomodel" -o "$work/x.safetensors"
[[ ! -e "$work/x.safetensors" ]] && ok "failed export writes nothing" || bad "failed export wrote"

# --- a flipped byte in the newest checkpoint's first tensor ---
p300="$ck/ckpt-000000000300.safetensors"
cp "$p300" "$work/good300"
python3 - "$p300" <<'EOF'
import json, struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
n = struct.unpack_from("<Q", b)[0]; h = json.loads(b[8:8 + n])
b[8 + n + h["model.fc1.weight"]["data_offsets"][0] + 1000] ^= 0x10
open(p, "wb").write(b)
EOF
before=$(state "$ck")
expect "verify names the corrupt tensor" 1 err "tensor 'model.fc1.weight': data checksum mismatch" \
  ckpt verify "$ck"
grep -qF "$p300" "$work/err" && ok "verify names the file" || bad "verify file: $(cat "$work/err")"
grep -qF "fall back to $ck/ckpt-000000000200.safetensors (step 200)" "$work/err" &&
  ok "verify says where a resume falls back" || bad "fallback line: $(cat "$work/err")"
expect "ls marks it BAD" 0 out "BAD: tensor 'model.fc1.weight'" ckpt ls "$ck"
expect "export falls back to 200" 0 out "(step 200)" ckpt export "$ck" -o "$work/wfb.safetensors"
grep -qF "skipped $p300" "$work/err" && ok "export reports the skipped file" ||
  bad "export skip line: $(cat "$work/err")"
cmp -s "$work/wfb.safetensors" "$work/w200.safetensors" && ok "fallback export = step 200 export" ||
  bad "fallback export differs"
expect "export --step of the corrupt one" 2 err "model.fc1.weight" ckpt export "$ck" --step 300 -o "$work/x"
[[ "$(state "$ck")" == "$before" ]] && ok "nothing deleted or changed by ls/verify/export" ||
  bad "the directory changed"

# --- truncated newest, broken latest ---
head -c 5000 "$work/good300" >"$p300"
expect "verify of a truncated newest" 1 err "ckpt-000000000300.safetensors" ckpt verify "$ck"
cp "$work/good300" "$p300"
expect "verify good again" 0 out "step 300" ckpt verify "$ck"
printf 'garbage\n' >"$ck/latest"
expect "verify with a garbage latest" 1 err "latest: does not hold a checkpoint file name" ckpt verify "$ck"
grep -q garbage "$work/err" && bad "the message quotes latest's content: $(cat "$work/err")" ||
  ok "the message does not quote latest's content"
grep -qF "(step 300)" "$work/err" && ok "garbage latest: a resume would scan to 300" ||
  bad "garbage latest fallback: $(cat "$work/err")"
printf 'ckpt-000000000900.safetensors\n' >"$ck/latest"
expect "verify with a dangling latest" 1 err "which does not exist" ckpt verify "$ck"
rm "$ck/latest"
expect "verify without latest" 1 err "latest: missing" ckpt verify "$ck"
expect "ls without latest" 0 out "latest: " ckpt ls "$ck"
printf 'ckpt-000000000300.safetensors\n' >"$ck/latest"

# --- a bad older checkpoint, a foreign file, a temporary file ---
printf 'torn' >"$ck/ckpt-000000000100.safetensors"
echo notes >"$ck/README"
printf 'partial' >"$ck/ckpt-000000000400.safetensors.tmp.4242.0"
expect "verify checks only latest" 0 out "ok (latest)" ckpt verify "$ck"
expect "verify --all fails on a bad older one" 1 err "ckpt-000000000100.safetensors" ckpt verify --all "$ck"
expect "ls counts temporary files apart" 0 out "1 temporary file" ckpt ls "$ck"
if [[ $(grep -c "^ckpt-" "$work/out") -eq 3 ]]; then ok "ls: temporary and foreign files are not listed"
else bad "ls rows: $(cat "$work/out")"; fi
[[ -e "$ck/README" && -e "$ck/ckpt-000000000400.safetensors.tmp.4242.0" ]] &&
  ok "foreign and temporary files left alone" || bad "files removed"

# --- non-finite weights and optimiser state (checksums right: written that way) ---
nf="$work/nonfinite"
mkdir -p "$nf"
"${mk[@]}" "$nf" 100 >/dev/null && "${mk[@]}" "$nf" 200 --latest --nan model.fc2.bias:17 >/dev/null ||
  bad "python writer (nan)"
before=$(state "$nf")
expect "verify reports a NaN weight" 1 err "tensor 'model.fc2.bias': element 17 is NaN" ckpt verify "$nf"
grep -qF "fall back to $nf/ckpt-000000000100.safetensors (step 100)" "$work/err" &&
  ok "verify: a resume would skip the NaN checkpoint" || bad "nan fallback line: $(cat "$work/err")"
expect "ls marks the NaN checkpoint BAD" 0 out "BAD: tensor 'model.fc2.bias': element 17 is NaN" ckpt ls "$nf"
expect "export --step of the NaN checkpoint refused" 2 err "element 17 is NaN" \
  ckpt export "$nf" --step 200 -o "$work/nan.safetensors"
[[ ! -e "$work/nan.safetensors" ]] && ok "no weights exported from it" || bad "NaN weights exported"
expect "export falls back past it" 0 out "(step 100)" ckpt export "$nf" -o "$work/w100.safetensors"
"${mk[@]}" --set "$nf/ckpt-000000000100.safetensors" optim.momentum 2 -inf
expect "verify --all reports an infinite optimiser state" 1 err "tensor 'optim.momentum': element 2 is -inf" \
  ckpt verify --all "$nf"
[[ "$(state "$nf" | grep -v 000000000100)" == "$(echo "$before" | grep -v 000000000100)" ]] &&
  ok "nothing else changed" || bad "the nonfinite directory changed"

# --- export never writes into a checkpoint store ---
for target in "$ck/w.safetensors" "$nf/w.safetensors" "$ck/./ckpt-000000000500.safetensors"; do
  before=$(state "$(dirname "$target")")
  expect "export -o inside a store refused ($(basename "$(dirname "$target")")/$(basename "$target"))" 2 err \
    "is a checkpoint store" ckpt export "$ck" --step 200 -o "$target"
  [[ "$(state "$(dirname "$target")")" == "$before" ]] && ok "nothing written into the store" ||
    bad "export wrote into $(dirname "$target")"
done
mkdir -p "$work/locked" && : >"$work/locked/.lock"
expect "export -o into a directory holding only a lock file refused" 2 err "is a checkpoint store" \
  ckpt export "$ck" --step 200 -o "$work/locked/w.safetensors"
[[ ! -e "$work/locked/w.safetensors" ]] && ok "nothing written beside the lock" || bad "wrote beside .lock"
mkdir -p "$work/plain" && echo x >"$work/plain/notes"
expect "export -o into a plain directory works" 0 out "(step 200)" ckpt export "$ck" --step 200 \
  -o "$work/plain/w.safetensors"

# --- empty directory ---
mkdir -p "$work/empty"
expect "ls of an empty dir" 0 out "no checkpoints" ckpt ls "$work/empty"
expect "verify of an empty dir" 1 err "latest: missing" ckpt verify "$work/empty"
expect "export of an empty dir" 2 err "no checkpoint" ckpt export "$work/empty" -o "$work/x"

it_finish
