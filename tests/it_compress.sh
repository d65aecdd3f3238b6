#!/usr/bin/env bash
# The compressed allreduce (fp16, bf16, onebit, onebit-noef) under real Open MPI ranks: with
# 4 and 3 ranks (a world that does not divide the buffers evenly) every rank gets the same
# bits as a one-process reference built from the format's definition, onebit's residuals
# keep inputs = results + residuals, and alltoall/allgather move and count what they should
# (tests/comm_check.c says each check). Skips (77) without mpirun.
set -u
. "$(dirname "$0")/itlib.sh"
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
CHECK=${RK_COMM_CHECK:?}
it_init compress
for np in 4 3 1; do
  if "${mpi[@]}" -np "$np" "$CHECK" >"$work/np$np.out" 2>&1; then
    ok "comm_check on $np rank(s): $(tail -1 "$work/np$np.out")"
  else
    cat "$work/np$np.out"
    bad "comm_check on $np rank(s)"
  fi
done
grep -h '^ok' "$work/np4.out" | sed 's/^/  /'
it_finish
