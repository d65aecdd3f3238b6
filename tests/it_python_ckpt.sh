#!/usr/bin/env bash
# The Python checkpoint store (python/rekindle/ckpt.py) and the C one read each other's files:
# checkpoints written by rekindle.ckpt pass `rk ckpt verify`, `ls` and `export`; a flipped
# byte is caught by both `rk ckpt verify` and ckpt.load, which fall back to the same file;
# checkpoints written by `rk train --ckpt-dir` load in Python with the same checksums, and
# re-encoded by Python they are byte for byte the files rk train wrote, from which
# `rk train --resume` ends with the uninterrupted run's weights; each refuses a directory
# whose lock the other holds. Skips (77) without a python3 that has xxhash; the rk train part
# skips without the data.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
py=$("$RK_SRC/tests/pyfind.sh" xxhash) || { echo "$py"; exit 77; }
it_init it_python_ckpt
export PYTHONPATH="$RK_SRC/python" PYTHONPYCACHEPREFIX="$work/pycache"

# 1. Python writes, rk reads
"$py" - "$work/py" <<'PY' || bad "python save"
import struct, sys
from rekindle import ckpt
d = sys.argv[1]
for s in (10, 20, 30):
    w = struct.pack("<6f", *[s + i / 4 for i in range(6)])
    ckpt.save(d, s, [ckpt.Item("model.fc1.weight", "F32", (2, 3), w),
                     ckpt.Item("model.fc1.bias", "F32", (2,), struct.pack("<2f", 1, -1)),
                     ckpt.Item("optim.m", "F64", (2,), struct.pack("<2d", s, 0.5)),
                     ckpt.Item("rng.torch", "U8", (4,), b"\1\2\3\4"),
                     ckpt.Item("data.cursor", "I64", (), struct.pack("<q", s * 64))],
              epoch=s // 10, cursor=s * 64, world_size=2, config='{"model":"mlp","batch":64}', keep=5)
PY
"$RK" ckpt verify --all "$work/py" >"$work/v.out" 2>&1 && ok "rk ckpt verify --all accepts Python's checkpoints: $(tail -1 "$work/v.out" | cut -c1-160)" ||
  bad "verify: $(cat "$work/v.out")"
"$RK" ckpt ls "$work/py" >"$work/ls.out" 2>&1
[[ $? == 0 && $(grep -c ' ok$' "$work/ls.out") == 3 ]] && grep -q "ckpt-000000000030.safetensors *30 *3 *1920 .*latest *ok" "$work/ls.out" &&
  ok "rk ckpt ls: 3 ok, step/epoch/cursor as written" || bad "ls: $(cat "$work/ls.out")"
"$RK" ckpt export "$work/py" -o "$work/w.st" >"$work/e.out" 2>&1 &&
  "$py" - "$work/w.st" <<'PY' && ok "rk ckpt export: the model.* tensors of step 30, bytes equal" || bad "export: $(cat "$work/e.out")"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = int.from_bytes(b[:8], "little")
h = json.loads(b[8:8 + n])
assert h["__metadata__"]["format"] == "rekindle-weights-1" and h["__metadata__"]["step"] == "30", h
assert [k for k in h if k != "__metadata__"] == ["fc1.weight", "fc1.bias"], h
t = h["fc1.weight"]
assert b[8 + n + t["data_offsets"][0]:8 + n + t["data_offsets"][1]] == struct.pack("<6f", *[30 + i / 4 for i in range(6)])
PY

# 2. a flipped byte: both refuse the file, both fall back to step 20
newest="$work/py/ckpt-000000000030.safetensors"
"$py" -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[-3]^=4; open(p,'wb').write(b)" "$newest"
"$RK" ckpt verify "$work/py" >"$work/v2.out" 2>&1
rc=$?
[[ $rc == 1 ]] && grep -q "tensor 'data.cursor': data checksum mismatch" "$work/v2.out" && grep -q "fall back to .*ckpt-000000000020" "$work/v2.out" &&
  ok "rk ckpt verify catches the flipped byte (exit 1) and would fall back to step 20" || bad "verify flipped: exit $rc $(cat "$work/v2.out")"
"$py" - "$work/py" "$newest" <<'PY' && ok "ckpt.load refuses it with the same message; load_latest falls back to step 20" || bad "python on the flipped file"
import sys
from rekindle import ckpt
try:
    ckpt.load(sys.argv[2])
    raise SystemExit("loaded a flipped file")
except ckpt.CheckpointError as e:
    assert "tensor 'data.cursor': data checksum mismatch (stored" in str(e), e
c, skipped = ckpt.load_latest(sys.argv[1])
assert c.step == 20 and len(skipped) == 1 and "ckpt-000000000030" in skipped[0], (c, skipped)
PY
"$py" -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); i=b.index(b'\"cursor\":\"1280\"'); b[i+10:i+14]=b'1281'; open(p,'wb').write(b)" "$work/py/ckpt-000000000020.safetensors"
"$RK" ckpt verify --all "$work/py" >"$work/v3.out" 2>&1
grep -q "ckpt-000000000020.safetensors: field 'xxh64.__manifest__' does not match" "$work/v3.out" &&
  "$py" -c "
import sys; from rekindle import ckpt
try: ckpt.load(sys.argv[1]); sys.exit(1)
except ckpt.CheckpointError as e: sys.exit(0 if \"field 'xxh64.__manifest__' does not match\" in str(e) else 1)" "$work/py/ckpt-000000000020.safetensors" &&
  ok "a changed header value: both say the manifest does not match" || bad "manifest: $(cat "$work/v3.out")"

# 3. rk train writes, Python reads (and writes the same bytes)
if [[ ! -e "$DATA/train-images-idx3-ubyte.gz" && ! -e "$DATA/train-images-idx3-ubyte" ]]; then
  echo "skip - Fashion-MNIST not found in $DATA: rk train's checkpoints not tested"
  it_finish
  exit
fi
"$py" "$RK_SRC/tests/make_subset.py" "$DATA" "$work/sub" 2000 200 >/dev/null || { bad "make subset"; it_finish; exit; }
train=("$RK" train --model mlp --max-steps 60 --epochs 4 --no-eval --data "$work/sub" --threads 1 --seed 3)
"${train[@]}" --metrics-json "$work/full.json" >/dev/null 2>&1 || bad "uninterrupted run"
"${train[@]}" --ckpt-dir "$work/c" --ckpt-every 20 --max-steps 40 >"$work/t.out" 2>&1 || bad "rk train --ckpt-dir: $(tail -3 "$work/t.out")"
"$py" - "$work/c" "$work/re" <<'PY' >"$work/p.out" 2>&1 && ok "rk train's checkpoints load in Python, every checksum as stored; re-encoded they are the same bytes: $(tail -1 "$work/p.out")" || bad "python reading rk train: $(tail -5 "$work/p.out")"
import os, sys, xxhash
from rekindle import ckpt
d, re = sys.argv[1], sys.argv[2]
c, skipped = ckpt.load_latest(d)
assert c is not None and c.step == 40 and skipped == [], (c, skipped)
names = [n for _, n in ckpt.list_checkpoints(d)]
for n in names:
    k = ckpt.load(os.path.join(d, n))
    for name, it in k.items.items():
        assert xxhash.xxh64(it.data).hexdigest() == k.metadata["xxh64." + name]
    p = ckpt.save(re, k.step, list(k.items.values()), epoch=k.epoch, cursor=k.cursor,
                  world_size=k.world_size, config=k.config)
    assert open(p, "rb").read() == open(os.path.join(d, n), "rb").read(), n
print(f"{len(names)} files, {len(c.items)} tensors in the newest (step {c.step}): {', '.join(list(c.items)[:4])}, ...")
PY
# one writer per directory, across the two: rk train is refused while Python holds the lock,
# and Python while rk train does
"$py" -c "import sys, time; from rekindle import ckpt; l = ckpt.lock(sys.argv[1], env={}); print(flush=True); time.sleep(30)" "$work/lk" >"$work/lk.out" &
holder=$!
pids+=("$holder")
for _ in $(seq 1 100); do [[ -s "$work/lk.out" ]] && break; sleep 0.05; done
"${train[@]}" --ckpt-dir "$work/lk" --max-steps 5 >"$work/lk.log" 2>&1
rc=$?
[[ $rc == 2 ]] && grep -q "another job writes to this checkpoint directory (pid $holder holds" "$work/lk.log" &&
  ok "rk train refuses a directory whose lock rekindle.ckpt holds (exit 2, names pid $holder)" || bad "lock held by Python: exit $rc $(tail -2 "$work/lk.log")"
kill "$holder"; wait "$holder" 2>/dev/null
"${train[@]}" --ckpt-dir "$work/lk2" --ckpt-every 5 --max-steps 100000 --epochs 100000 >"$work/lk2.log" 2>&1 &
trainer=$!
pids+=("$trainer")
for _ in $(seq 1 200); do [[ -f "$work/lk2/latest" ]] && break; sleep 0.05; done
"$py" -c "
import sys; from rekindle import ckpt
try: ckpt.lock(sys.argv[1], env={})
except ckpt.LockedError as e: print(e.holder); sys.exit(0)
sys.exit(1)" "$work/lk2" >"$work/lk2.out" 2>&1 && [[ "$(cat "$work/lk2.out")" == "$trainer" ]] &&
  ok "ckpt.lock refuses a directory rk train writes (LockedError, holder pid $trainer)" || bad "lock held by rk train: $(cat "$work/lk2.out")"
kill "$trainer"; wait "$trainer" 2>/dev/null

"${train[@]}" --ckpt-dir "$work/re" --ckpt-every 20 --resume --metrics-json "$work/re.json" >"$work/r.out" 2>&1 &&
  grep -q "resuming from" "$work/r.out" && [[ "$(json "$work/re.json" weights_xxh64)" == "$(json "$work/full.json" weights_xxh64)" ]] &&
  ok "rk train --resume from Python's files ends with the uninterrupted run's weights ($(json "$work/full.json" weights_xxh64))" ||
  bad "resume from Python's files: $(tail -3 "$work/r.out")"
it_finish
