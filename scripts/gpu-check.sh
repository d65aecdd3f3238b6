#!/usr/bin/env bash
# scripts/gpu-check.sh [RESULTS.md]: everything of rekindle that needs a real GPU, in one
# command and under 5 minutes on a GPU machine (docs/gpu.md). Configures and builds build-gpu/
# (Release, RK_GPU_BENCH=ON), then runs:
#   1. the GPU unit and integration tests (ctest -R 'gpu|burn': PTX assembled by ptxas when
#      the toolkit is there),
#   2. rk burn --duration 1m on every GPU (state file in the build directory: GFLOP/s, verdict),
#   3. bench/gpu_sgemm: our SGEMM against cuBLAS, same sizes (goal ours/cuBLAS >= 0.7),
#   4. bench/gpu_pool: the pool against cuMemAlloc/cuMemFree (when built: the pool is in the tree),
# and writes a markdown table of the results to RESULTS.md (default build-gpu/gpu-check.md),
# naming it at the end. Without a GPU it says so in one line and exits 1.
# Environment: BURN_DURATION (default 1m), JOBS (default: all cores).
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
build=$src/build-gpu
out=${1:-$build/gpu-check.md}
jobs=${JOBS:-$(nproc)}
burn_for=${BURN_DURATION:-1m}

if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' && [[ -z ${RK_CUDA_LIB:-} ]]; then
  echo "gpu-check: no GPU here (no CUDA driver: libcuda.so.1 not found); nothing run"
  exit 1
fi
mkdir -p "$build"
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DRK_GPU_BENCH=ON >"$build/configure.log" 2>&1 ||
  { echo "gpu-check: configure failed, see $build/configure.log"; exit 1; }
cmake --build "$build" -j"$jobs" >"$build/build.log" 2>&1 ||
  { echo "gpu-check: build failed, see $build/build.log"; exit 1; }
mkdir -p "$(dirname "$out")"
failed=0
{
  echo "# rekindle GPU check"
  echo
  echo "- when: $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?')"
  if command -v nvidia-smi >/dev/null; then
    echo "- GPUs: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | paste -sd ';')"
  fi
  echo
} >"$out"

echo "gpu-check: tests"
(cd "$build" && ctest -R 'gpu|burn' --output-on-failure) >"$build/ctest.log" 2>&1 || failed=1
{
  echo "## Tests (ctest -R 'gpu|burn')"
  echo
  echo '```'
  grep -E 'Test +#|tests passed|Skipped|Failed' "$build/ctest.log"
  echo '```'
  echo
} >>"$out"

echo "gpu-check: rk burn --duration $burn_for"
state=$build/burn-state.json
rm -f "$state"
RK_BURN_STATE=$state "$build/rk" burn --duration "$burn_for" --json >"$build/burn.json" 2>"$build/burn.err"
burn_rc=$?
((burn_rc == 0)) || failed=1
{
  echo "## rk burn --duration $burn_for (exit $burn_rc)"
  echo
  python3 - "$build/burn.json" "$build/burn.err" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("no JSON from rk burn (%s): %s" % (e, open(sys.argv[2]).read().strip()[:400]))
    sys.exit(0)
print("| GPU | name | variant | n x copies | rounds | GFLOP/s | memory GiB | max C | SM MHz | throttle | verdict |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for g in d["gpus"]:
    v = "OK" if g["ok"] else "FAULTY: " + g["failed"]
    mhz = "-" if g["sm_min_mhz"] is None else "%.0f-%.0f" % (g["sm_min_mhz"], g["sm_max_mhz"])
    t = "-" if g["temp_max_c"] is None else "%.0f" % g["temp_max_c"]
    print("| %d | %s | %s | %d x %d | %d | %.0f | %.1f | %s | %s | %s | %s |" % (
        g["index"], g["name"], g["variant"] or "-", g["n"], g["copies"], g["rounds"],
        g["gflops"], g["mem_bytes"] / 2**30, t, mhz, g["clock_reasons"], v))
PY
  echo
} >>"$out"

echo "gpu-check: gpu_sgemm"
"$build/gpu_sgemm" >"$build/gpu_sgemm.md" 2>&1 || failed=1
{
  echo "## bench/gpu_sgemm: our SGEMM vs cuBLAS (goal ours/cuBLAS >= 0.7)"
  echo
  cat "$build/gpu_sgemm.md"
  echo
} >>"$out"

if [[ -x $build/gpu_pool ]]; then
  echo "gpu-check: gpu_pool"
  "$build/gpu_pool" >"$build/gpu_pool.md" 2>&1 || failed=1
  { echo "## bench/gpu_pool: the pool vs cuMemAlloc/cuMemFree"; echo; cat "$build/gpu_pool.md"; echo; } >>"$out"
else
  { echo "## bench/gpu_pool"; echo; echo "not built: the pool (src/gpu/pool.h, bench/pool_trace.h) is not in this tree"; echo; } >>"$out"
fi
echo "gpu-check: results in $out$( ((failed)) && echo ' (something failed: see it)')"
exit $failed
