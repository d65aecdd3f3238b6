#!/usr/bin/env bash
# rk train's loss-spike guard (docs/guards.md) on a spike that is the data: 2 ranks of rk train
# under rk run on 1,024 Fashion-MNIST images, two of them with a wrong label (examples the
# model cannot agree with: when one comes back in a batch of a nearly converged model, the
# step's loss jumps, robust z 16 at step 443 with seed 1). The spike is checked by every
# rank's forward again, which gives the same bits: one `spike_kept` event that says so, and no
# `loss_spike` redo (before, the whole step was computed twice to learn the same thing); the
# final weights are those of the same run with the guards off, bit for bit.
# Skips (77) without mpirun or Fashion-MNIST.
set -u
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_need_data
it_init it_guard_spike
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none

python3 "$RK_SRC/tests/make_subset.py" "$DATA" "$work/sub" 1024 64 || { bad "make subset"; exit 1; }
python3 - "$work/sub/train-labels-idx1-ubyte" <<'PY' || { bad "flip two labels"; exit 1; }
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
for i in (100, 700):  # IDX: an 8-byte header, then one byte a label
    b[8 + i] = (b[8 + i] + 5) % 10
open(p, "wb").write(b)
PY

# train NAME [rk train flags...]: 2 ranks, 460 steps; NAME.out, NAME.events
train() {
  local name=$1; shift
  "$RK" run -n 2 --events "$work/$name.events" -- "$RK" train --data "$work/sub" --threads 1 --seed 1 \
    --batch 32 --epochs 40 --max-steps 460 --no-eval "$@" >"$work/$name.out" 2>&1
}
weights() { sed -n 's/.*weights xxh64 \([0-9a-f]*\).*/\1/p' "$work/$1.out" | tail -1; }

train off --guard off && ok "guards off: the run finishes" || bad "guards off: exit $?: $(tail -3 "$work/off.out")"
train on && ok "guards on: the run finishes" || bad "guards on: exit $?: $(tail -3 "$work/on.out")"
a=$(weights off) b=$(weights on)
[[ -n $a && $a == "$b" ]] && ok "the same weights with the guards on and off ($b)" ||
  bad "weights with the guards on '$b', off '$a'"
it_count python3 - "$work/on.events" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
kinds = [(e["kind"], e["step"]) for e in ev]
kept = [e for e in ev if e["kind"] == "spike_kept"]
ok = (kept and all("every rank's forward again gave the same bits: the data, not a fault" in e["detail"] for e in kept)
      and not [e for e in ev if e["kind"] == "loss_spike"])
print(("ok - " if ok else "FAIL - ") + f"the spike kept after every rank's forward again, no step redone: {kinds} "
      f"{[e['detail'] for e in ev][:3]}")
PY
it_finish
