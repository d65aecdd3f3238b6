#!/usr/bin/env bash
# The rekindle Python package's tests (python/tests, unittest: the heartbeat protocol against
# a socket server and under rk run, the checkpoint store, the fault spec against the C parser,
# stack dumps, a reader fuzz run, pip install) with a python3 that has Debian's xxhash. The
# torch tests skip themselves without torch. Skips (77) when no python3 here imports xxhash.
set -u
RK=${RK:?} RK_SRC=${RK_SRC:?} RK_TMP=${RK_TMP:?}
py=$("$RK_SRC/tests/pyfind.sh" xxhash) || { echo "$py"; exit 77; }
mkdir -p "$RK_TMP"
export RK RK_SRC RK_TMP RK_BUILD=${RK_BUILD:-$(dirname "$RK")}
export PYTHONPYCACHEPREFIX="$RK_TMP/pycache"  # no __pycache__ in the source tree
echo "python: $py ($("$py" -c 'import sys, xxhash; print(sys.version.split()[0], "xxhash", xxhash.VERSION)'))"
cd "$RK_SRC" && exec "$py" -m unittest discover -s python/tests -t python/tests -v 2>&1
