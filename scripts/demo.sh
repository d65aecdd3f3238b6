#!/usr/bin/env bash
# make demo: the main job. rk run supervises 4 ranks of `rk train --model cnn-small` (one
# epoch of Fashion-MNIST) while a scripted set of faults is injected: a crash, a NaN, a hang,
# a flipped bit in one replica's parameters, a flipped gradient exponent and a communication
# failure. Two devices fail twice and are quarantined, so the job shrinks from 4 ranks to 2
# and still finishes; the summary at the end says what happened and what it cost.
# The 4 ranks are CPU processes standing in for 4 GPUs; the faults are injected (simulated).
# Usage: scripts/demo.sh [BUILD_DIR]   (files in runs/demo/)
set -euo pipefail
build=${1:-build}
rk=$build/rk
out=runs/demo
rm -rf "$out"
mkdir -p "$out"
# Open MPI inside containers: shared memory without cross-memory attach (harmless elsewhere)
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
faults="crash@step=150:rank=2,nan@step=250:rank=0,hang@step=350:rank=1,bitflip@step=450:rank=3"
faults+=",gradflip@step=550:rank=1,commfail@step=700:rank=0"
echo "demo: 4 CPU ranks stand in for 4 GPUs (no GPU is used); faults are injected (simulated):"
echo "demo:   $faults"
set +e
"$rk" run -n 4 --ckpt-dir "$out/ckpt" --heartbeat-timeout 5 \
  --events "$out/events.jsonl" --summary-json "$out/summary.json" --inject "$faults" \
  -- "$rk" train --model cnn-small --epochs 1 --ckpt-every 50 --ckpt-async \
  --metrics-json "$out/metrics.json"
st=$?
set -e
echo "demo: events in $out/events.jsonl, summary in $out/summary.json, checkpoints in $out/ckpt"
exit $st
