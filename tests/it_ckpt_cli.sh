#!/usr/bin/env bash
# Integration test of `rk ckpt ls|verify|export` on real files: checkpoints are written by an
# independent Python implementation of docs/checkpoint.md (so the C reader is checked against
# the documented format, not against itself), then corrupted, truncated and mislabelled.
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

cat >"$work/mk.py" <<'EOF'
"""Write a rekindle checkpoint as docs/checkpoint.md describes, with the standard library.
usage: mk.py DIR STEP [--config JSON] [--latest] [--tiny]"""
import json, random, struct, sys
P1, P2, P3 = 11400714785074694791, 14029467366897019727, 1609587929392839161
P4, P5, M = 9650029242287828579, 2870177450012600261, (1 << 64) - 1
def rotl(x, r): return ((x << r) | (x >> (64 - r))) & M
def rnd(acc, v): return (rotl((acc + v * P2) & M, 31) * P1) & M
def xxh64(d):
    n, i = len(d), 0
    if n >= 32:
        v = [(P1 + P2) & M, P2, 0, (-P1) & M]
        lanes = struct.unpack_from("<%dQ" % (n // 32 * 4), d)
        for j in range(0, len(lanes), 4):
            v = [rnd(v[k], lanes[j + k]) for k in range(4)]
        i = n // 32 * 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for x in v: h = ((h ^ rnd(0, x)) * P1 + P4) & M
    else:
        h = P5
    h = (h + n) & M
    while i + 8 <= n:
        h = (rotl(h ^ rnd(0, struct.unpack_from("<Q", d, i)[0]), 27) * P1 + P4) & M; i += 8
    if i + 4 <= n:
        h = (rotl(h ^ (struct.unpack_from("<I", d, i)[0] * P1 & M), 23) * P2 + P3) & M; i += 4
    while i < n:
        h = (rotl(h ^ (d[i] * P5 & M), 11) * P1) & M; i += 1
    h ^= h >> 33; h = (h * P2) & M; h ^= h >> 29; h = (h * P3) & M; h ^= h >> 32
    return h
args = sys.argv[1:]
d, step = args[0], int(args[1])
config = args[args.index("--config") + 1] if "--config" in args else '{"model":"mlp","batch":64}'
mlp = [("fc1.weight", [256, 784]), ("fc1.bias", [256]), ("fc2.weight", [128, 256]),
       ("fc2.bias", [128]), ("fc3.weight", [10, 128]), ("fc3.bias", [10])]
if "--tiny" in args: mlp = [("fc.weight", [2, 3]), ("fc.bias", [2])]
r = random.Random(step)
tensors = []
for name, shape in mlp:
    n = 1
    for s in shape: n *= s
    tensors.append(("model." + name, "F32", shape,
                    struct.pack("<%df" % n, *[r.uniform(-0.05, 0.05) for _ in range(n)])))
tensors.append(("optim.momentum", "F32", [4], struct.pack("<4f", 1, 2, 3, step)))
tensors.append(("rng.state", "U8", [13], bytes((step + k) & 255 for k in range(13))))
meta = {"format": "rekindle-ckpt-1", "step": str(step), "epoch": str(step // 100),
        "cursor": str(step * 64 % 60000), "world_size": "3", "config": config}
for name, _, _, data in tensors: meta["xxh64." + name] = "%016x" % xxh64(data)
text, off, table = b"", 0, {}
for k in sorted(meta, key=lambda k: k.encode()):
    text += k.encode() + b"\0" + meta[k].encode() + b"\0"
for name, dt, shape, data in tensors:
    table[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
    text += b"\0".join(x.encode() for x in
                       [name, dt, ",".join(map(str, shape)), str(off), str(off + len(data))]) + b"\0"
    off += len(data)
meta["xxh64.__manifest__"] = "%016x" % xxh64(text)
hdr = json.dumps({"__metadata__": meta, **table}, separators=(",", ":")).encode()
hdr += b" " * (-len(hdr) % 8)
name = "ckpt-%012d.safetensors" % step
with open(f"{d}/{name}", "wb") as f:
    f.write(struct.pack("<Q", len(hdr)) + hdr + b"".join(t[3] for t in tensors))
if "--latest" in args:
    open(f"{d}/latest", "w").write(name + "\n")
# weights_xxh64 of the model tensors, as `rk train --metrics-json` reports it (docs/weights.md)
print("%016x" % xxh64(b"".join(t[3] for t in tensors if t[0].startswith("model."))))
EOF

ck="$work/ckpts"
mkdir -p "$ck"
python3 "$work/mk.py" "$ck" 100 >/dev/null &&
  h200=$(python3 "$work/mk.py" "$ck" 200) &&
  python3 "$work/mk.py" "$ck" 300 --latest >/dev/null || { bad "python writer"; exit 1; }

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
expect "verify of a file" 2 err "not a directory" ckpt verify "$work/mk.py"
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
python3 "$work/mk.py" "$work" 7 --tiny --config '{"batch":8}' >/dev/null
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

# --- empty directory ---
mkdir -p "$work/empty"
expect "ls of an empty dir" 0 out "no checkpoints" ckpt ls "$work/empty"
expect "verify of an empty dir" 1 err "latest: missing" ckpt verify "$work/empty"
expect "export of an empty dir" 2 err "no checkpoint" ckpt export "$work/empty" -o "$work/x"

it_finish
