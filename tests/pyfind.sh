#!/usr/bin/env bash
# Prints the path of a Python 3 interpreter that can import every module named on the command
# line (e.g. `tests/pyfind.sh torch xxhash`): `python3` on PATH first, then Debian's
# /usr/bin/python3 (a python3 of pyenv or a virtualenv earlier on PATH may lack Debian's
# python3-torch and python3-xxhash). None: a SKIP line naming the modules on stdout, exit 77,
# so a test can do `py=$("$RK_SRC/tests/pyfind.sh" torch) || { echo "$py"; exit 77; }`.
set -u
for cand in "$(command -v python3 2>/dev/null)" /usr/bin/python3; do
  [[ -n "$cand" && -x "$cand" ]] || continue
  if "$cand" -c "import sys, importlib; [importlib.import_module(m) for m in sys.argv[1:]]" "$@" 2>/dev/null; then
    echo "$cand"
    exit 0
  fi
done
echo "SKIP: no python3 here imports: $* (Debian: apt-get install python3-torch python3-xxhash python3-numpy; scripts/install-deps.sh test)"
exit 77
