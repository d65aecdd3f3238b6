#!/usr/bin/env bash
# make demo: the main job. A node of 5 simulated GPUs (seed 40, 8,000 hours of service; one
# spare; busy, as GPUs in a job are, with the VRM and fan sensors fitted: --sim-load busy
# --sim-sensors): rk doctor checks them, rk exporter serves their
# health to Prometheus while the run goes, and rk run supervises 4 ranks of
# `rk train --model cnn-small` (one epoch of Fashion-MNIST) through a scripted set of injected
# faults: a crash, a NaN, a hang, a flipped bit in one replica's parameters, a flipped
# gradient exponent and a communication failure. The GPUs age half an hour with each step
# the job does (--sim-step-time 30m), so the story is the same on a quiet machine and a busy
# one: GPU 3 runs hot near step 190 and the health gate drains it (the spare takes its
# place); the device behind rank 2 fails three times (--failure-threshold 3) and is
# quarantined, and the job shrinks onto the rest.
# The summary at the end says what happened and what it cost, and `rk report` draws the run
# as one HTML page (runs/demo/report.html: loss with every incident, goodput, devices, GPU
# health). The ranks are CPU processes standing in for the GPUs; GPUs and faults are
# simulated, and every line about them says so.
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
sim=(--sim-load busy --sim-sensors)
fleet=(--sim 5 --seed 40 --age 8000 "${sim[@]}")

echo "== rk doctor: the node's GPUs (simulated fleet)"
set +e
"$rk" doctor "${fleet[@]}"
set -e

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# the exporter's fleet ages with the wall clock (--time-scale), about the job's pace
"$rk" exporter "${fleet[@]}" --time-scale 40000 --interval 2s --listen "127.0.0.1:$port" \
  >"$out/exporter.log" 2>&1 &
exporter=$!
trap 'kill "$exporter" 2>/dev/null; wait "$exporter" 2>/dev/null' EXIT
echo
echo "== rk exporter: http://127.0.0.1:$port/metrics (simulated GPUs; log in $out/exporter.log)"
echo

faults="crash@step=150:rank=2,nan@step=250:rank=0,hang@step=350:rank=1,bitflip@step=450:rank=2"
faults+=",gradflip@step=550:rank=0,commfail@step=700:rank=2"
echo "== rk run: 4 CPU ranks stand in for 4 of the GPUs; faults are injected (simulated):"
echo "   $faults"
set +e
"$rk" run -n 4 --devices 0,1,2,3,4 --ckpt-dir "$out/ckpt" --heartbeat-timeout 5 \
  --failure-threshold 3 --health sim --sim-seed 40 --sim-age 8000 "${sim[@]}" --sim-step-time 30m \
  --health-interval 2 \
  --events "$out/events.jsonl" --summary-json "$out/summary.json" --inject "$faults" \
  --steps "$out/steps.jsonl" --gate-log "$out/gate.jsonl" \
  -- "$rk" train --model cnn-small --epochs 1 --ckpt-every 50 --ckpt-async \
  --metrics-json "$out/metrics.json"
st=$?
set -e
echo "demo: exporter was at http://127.0.0.1:$port/metrics; events in $out/events.jsonl,"
echo "demo: summary in $out/summary.json, checkpoints in $out/ckpt"
echo
echo "== rk report: the run at a glance"
if "$rk" report "$out" -o "$out/report.html"; then
  echo "demo: open $(cd "$out" && pwd)/report.html in a browser (one file, works offline)"
else
  echo "demo: rk report could not draw the run (above)"
  [[ $st != 0 ]] || st=1
fi
exit $st
