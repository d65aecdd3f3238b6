#!/usr/bin/env bash
# The GPU kernels' PTX (src/gpu/kernels.cu compiled by clang at build time) assembles with
# NVIDIA's ptxas: the sm_80 module for sm_80, the sm_61 module for sm_75 (CUDA 13's ptxas
# cannot target sm_61; the PTX is the same ISA). Every kernel rk burn looks up is in both.
# Skipped when ptxas is absent (set PTXAS=... to point at one) or the build has no kernels.
set -u
. "$(dirname "$0")/itlib.sh"
it_init gpu_ptx
ptxas=${PTXAS:-/usr/local/cuda/bin/ptxas}
gen=${RK_BUILD:?}/gen/gpu
if [[ ! -x $ptxas ]]; then
  echo "SKIP: ptxas not found at $ptxas (the CUDA toolkit is not installed; PTXAS=... to set)"
  exit 77
fi
if [[ ! -s $gen/kernels_sm61.ptx || ! -s $gen/kernels_sm80.ptx ]]; then
  echo "SKIP: this build has no GPU kernels ($gen/kernels_sm*.ptx missing: built without clang)"
  exit 77
fi
kernels=(rk_fill_input rk_compare rk_mt_lines_write rk_mt_lines_check rk_mt_own_write
  rk_mt_own_check rk_mt_fill rk_mt_check_invert rk_mt_check rk_mt_random_write
  rk_mt_random_check)
while read -r v; do kernels+=("$v"); done < <(sed -n 's/^ *X(\(rk_sgemm_[0-9x_]*\),.*/\1/p' \
  "$RK_SRC/src/gpu/ref_common.h")
[[ ${#kernels[@]} -gt 12 ]] && ok "the SGEMM variants are listed (${#kernels[@]} kernels)" ||
  bad "no SGEMM variants found in ref_common.h"
for pair in "61 sm_75" "80 sm_80"; do
  set -- $pair
  if "$ptxas" -arch="$2" "$gen/kernels_sm$1.ptx" -o "$work/k$1.cubin" 2>"$work/err$1"; then
    ok "kernels_sm$1.ptx assembles for $2"
  else
    bad "kernels_sm$1.ptx does not assemble for $2: $(head -3 "$work/err$1")"
  fi
  missing=()
  for k in "${kernels[@]}"; do
    grep -q "^.visible .entry $k(" "$gen/kernels_sm$1.ptx" || missing+=("$k")
  done
  [[ ${#missing[@]} -eq 0 ]] && ok "kernels_sm$1.ptx has every kernel" ||
    bad "kernels_sm$1.ptx lacks ${missing[*]}"
done
# register use: no SGEMM variant spills (a spill would halve its speed)
if "$ptxas" -arch=sm_80 -v "$gen/kernels_sm80.ptx" -o "$work/v.cubin" 2>"$work/v.txt" &&
  ! grep -A2 "Function properties for rk_sgemm" "$work/v.txt" | grep -q "[1-9][0-9]* bytes spill stores"; then
  ok "no SGEMM variant spills registers on sm_80"
else
  bad "an SGEMM variant spills registers on sm_80: $(grep -B2 'bytes spill' "$work/v.txt" | head -6)"
fi
it_finish
