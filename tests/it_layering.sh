#!/usr/bin/env bash
# The layering of docs/design.md ("Who may include whom") holds (issue 32): every #include
# under src/, cli/ and include/ is one the table scripts/layers.txt allows
# (scripts/check-layers.py). The checker's self-test first shows it names an upward, a
# sideways and a private-header include in a fake tree and refuses bad tables; then a copy of
# this tree with one deliberately wrong include (base including the supervisor's private
# state) must fail, naming that line and no other, and with a second (the supervisor
# including the cluster's header) must name that one too. scripts/call-cycles.py's self-test
# runs too (it finds the circles it planted in a fake room), then the check itself: no call
# circle between the .c files of src/supervisor/, of src/cluster/, or of both together.
# Needs RK_SRC, RK_TMP (RK is not used); skips (77) without python3.
set -u
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_layering

check=$RK_SRC/scripts/check-layers.py
if python3 "$check" --self-test >"$work/self.out" 2>&1; then
  ok "$(cat "$work/self.out")"
else
  bad "the checker's self-test: $(cat "$work/self.out")"
fi

python3 "$check" --root "$RK_SRC" >"$work/tree.out" 2>&1
rc=$?
if [[ $rc == 0 ]]; then
  ok "every #include under src/, cli/ and include/ is one scripts/layers.txt allows"
else
  bad "the tree breaks the layering (status $rc):"$'\n'"$(cat "$work/tree.out")"
fi

# The same tree with one wrong include added: the check must fail on it, and only on it.
mkdir "$work/tree"
cp -r "$RK_SRC/src" "$RK_SRC/cli" "$RK_SRC/include" "$RK_SRC/scripts" "$work/tree/"
sed -i 's|^#include "base/text.h"$|&\n#include "supervisor/sup.h"|' "$work/tree/src/base/text.c"
line=$(grep -n '^#include "supervisor/sup.h"$' "$work/tree/src/base/text.c" | cut -d: -f1)
python3 "$check" --root "$work/tree" >"$work/wrong.out" 2>&1
rc=$?
want="src/base/text.c:$line: src/base includes src/supervisor/sup.h: upward"
if [[ -n $line && $rc == 1 ]] && grep -q "^$want " "$work/wrong.out" &&
  [[ $(grep -c '^src/\|^cli/\|^include/' "$work/wrong.out") == 1 ]]; then
  ok "a copy with src/base/text.c including supervisor/sup.h fails (1): $(head -1 "$work/wrong.out")"
else
  bad "the wrong include (line ${line:-none}) was not named alone with status 1 (status $rc):"$'\n'"$(cat "$work/wrong.out")"
fi

# The supervisor knows no hosts: src/supervisor including the cluster's header (a layer
# above it) fails too.
sed -i 's|^#include "supervisor/sup.h"$|&\n#include "cluster/cluster.h"|' "$work/tree/src/supervisor/run.c"
line=$(grep -n '^#include "cluster/cluster.h"$' "$work/tree/src/supervisor/run.c" | cut -d: -f1)
python3 "$check" --root "$work/tree" >"$work/wrong2.out" 2>&1
rc=$?
want="src/supervisor/run.c:$line: src/supervisor includes src/cluster/cluster.h: upward"
if [[ -n $line && $rc == 1 ]] && grep -q "^$want " "$work/wrong2.out"; then
  ok "a copy with src/supervisor/run.c including cluster/cluster.h fails (1): $(grep "^$want " "$work/wrong2.out")"
else
  bad "the supervisor's include of the cluster (line ${line:-none}) was not named with status 1 (status $rc):"$'\n'"$(cat "$work/wrong2.out")"
fi

cycles=$RK_SRC/scripts/call-cycles.py
if python3 "$cycles" --self-test >"$work/cycles.out" 2>&1; then
  ok "$(cat "$work/cycles.out")"
else
  bad "call-cycles' self-test: $(cat "$work/cycles.out")"
fi
# Counted: no two .c files of src/supervisor/ or src/cluster/ call each other in a circle
# (each room alone, and the two together: the supervisor never calls the cluster's files,
# a backend is reached through its table), the command docs/design.md names.
for room in src/supervisor src/cluster "src/supervisor src/cluster"; do
  # shellcheck disable=SC2086 # the rooms are words
  if (cd "$RK_SRC" && python3 "$cycles" --list $room) >"$work/cl.out" 2>&1; then
    ok "$(tail -n 1 "$work/cl.out")"
  else
    bad "$room has a call circle: $(cat "$work/cl.out")"
  fi
done
it_finish
