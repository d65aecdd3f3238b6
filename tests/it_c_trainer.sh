#!/usr/bin/env bash
# A second trainer on the worker runtime, built as a library user would build it: the build
# is installed into a scratch prefix, examples/c_trainer is compiled there against the
# installed headers and librekindle with `pkg-config rekindle` alone, and the installed
# `rk run` supervises 2 ranks of it under mpirun through a crash, a hang and a bit flip in
# one replica's weights (repaired from the majority and replayed). The faults run must end
# with the fault-free run's state hash, and the events must name each fault and its
# recovery. Skips (77) without mpirun, make or pkg-config.
set -u
for t in mpirun make pkg-config; do
  command -v $t >/dev/null || { echo "SKIP: $t not found"; exit 77; }
done
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
RK_BUILD=${RK_BUILD:?}
it_init it_c_trainer
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none

prefix=$work/prefix
cmake --install "$RK_BUILD" --prefix "$prefix" >"$work/install.log" 2>&1 ||
  { bad "cmake --install: $(tail -3 "$work/install.log")"; it_finish; exit; }
pc=$(find "$prefix" -name rekindle.pc | head -1)
[[ -n "$pc" ]] || { bad "no rekindle.pc installed"; it_finish; exit; }
# the .pc file finds its prefix from where it is installed: no edit needed
export PKG_CONFIG_PATH=$(dirname "$pc")
libdir=$(pkg-config --variable=libdir rekindle)
cp -r "$RK_SRC/examples/c_trainer" "$work/src"
if make -C "$work/src" LDFLAGS="-Wl,-rpath,$libdir" >"$work/make.log" 2>&1; then
  ok "examples/c_trainer builds against the installed tree with pkg-config rekindle"
else bad "make: $(tail -5 "$work/make.log")"; it_finish; exit; fi
trainer=$work/src/trainer
rk=$prefix/bin/rk

# sup NAME [rk run flags...]: 2 supervised ranks; output, events, summary, state hash
sup() {
  local name=$1; shift
  "$rk" run -n 2 --ckpt-dir "$work/$name.ck" --heartbeat-timeout 3 --quiet \
    --events "$work/$name.events" --summary-json "$work/$name.sum" "$@" \
    -- "$trainer" --steps 300 --sleep-ms 2 --hash-file "$work/$name.hash" >"$work/$name.out" 2>&1
}

if sup ref; then ok "fault-free run under rk run finishes"
else bad "fault-free run: exit $?: $(tail -5 "$work/ref.out")"; it_finish; exit; fi
ref=$(cat "$work/ref.hash")
# alone (no supervisor, no MPI: every link a no-op) it trains too; one rank sums the batch
# in another order than two, so its bits are its own
"$trainer" --steps 300 --hash-file "$work/alone.hash" >"$work/alone.out" 2>&1 &&
  [[ -s "$work/alone.hash" ]] && ok "one process alone, without rk run or mpirun, trains" ||
  bad "alone: $(tail -2 "$work/alone.out")"

spec="crash@step=40:rank=1,hang@step=90:rank=0,bitflip@step=133:rank=1"
# as docs/worker.md runs it: the default --failure-threshold 2 (one failure per device here)
if sup faults --inject "$spec"; then ok "run through a crash, a hang and a bitflip finishes"
else bad "faults run: exit $?: $(tail -8 "$work/faults.out")"; fi
h=$(cat "$work/faults.hash" 2>/dev/null)
[[ $h == "$ref" ]] && ok "state xxh64 $h equals the fault-free run's" ||
  bad "state xxh64 '$h' differs from the fault-free $ref"
python3 - "$work/faults.events" "$work/faults.sum" <<'PY' && ok "events and summary name every fault" || bad "events/summary"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
kinds = {}
for e in ev:
    kinds.setdefault(e["kind"], []).append(e)
# the crash is rank 1's (it announced it: rk run blames it even when it reads rank 0's end,
# which mpirun kills at once, first). With 2 ranks a mismatch has no majority: nobody is
# blamed, and the detail says so.
want = {"crash": (1, "relaunch"), "hang": (0, "relaunch"), "replica_mismatch": (None, "rollback")}
for kind, (rank, action) in want.items():
    assert kind in kinds, f"no {kind} event in {sorted(kinds)}"
    e = kinds[kind][0]
    assert (rank is None or e["rank"] == rank) and e["action"] == action, f"{kind}: {e}"
    print(f"{kind}: rank {e['rank']} {e['action']} lost {e['lost_steps']}")
rm = kinds["replica_mismatch"][0]
assert rm["rank"] is None and "no majority" in rm["detail"], rm
assert "replaying from step 130" in rm["detail"], rm
inj = sorted((e["rank"], e["detail"]) for e in kinds.get("inject", []))
assert [r for r, _ in inj] == [0, 1, 1] and len(inj) == 3, f"injections: {inj}"
s = json.load(open(sys.argv[2]))
assert s["restarts"] == 2 and s["quarantined"] == 0, s
PY
grep -q "injected bitflip" "$work/faults.out" && ok "the bitflip was delivered to a registered buffer" ||
  bad "no bitflip note in the output"
it_finish
