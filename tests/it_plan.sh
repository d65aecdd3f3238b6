#!/usr/bin/env bash
# rk plan end to end (docs/plan.md). Usage and bad input first: no fleet, an unknown flag, a
# bad number, a bad failure model, --trace without stepfun-trace, a fleet file that is not one
# (unknown field, cards that do not divide among the hosts, a FIFO), a summary that is not
# JSON: each exit 2 with one line naming the problem. Then the docs' worked example (20 GTX
# 1070 Ti on 5 hosts against 4 new cards) as a table and as JSON, the same seed giving the
# same JSON, an rk run summary read as the job, and the InfiniteHBD trace replayed (584
# faults, skipped with a message when ../shared/data is absent). A few seconds.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_plan
TRACE=${RK_INFINITEHBD_DIR:-$RK_SRC/../shared/data/infinitehbd}/fault_trace.json

expect2() { # NAME PATTERN ARGS...: exit 2 and PATTERN on stderr
  local name=$1 pat=$2; shift 2
  "$RK" plan "$@" >"$work/out" 2>"$work/err"; local st=$?
  if [[ $st == 2 ]] && grep -q -- "$pat" "$work/err"; then ok "$name (exit 2)"
  else bad "$name: exit $st: $(head -c 300 "$work/err")"; fi
}
cat >"$work/fleet.txt" <<'F'
# docs/plan.md, "A worked example": 20 ex-mining GTX 1070 Ti on 5 hosts
hosts 5
card model=gtx-1070-ti count=20 hours=26280 score=80 watts=180 price=110 tflops=8.2
F
cat >"$work/new.txt" <<'F'
hosts 1
card model=rtx-4090 count=4 watts=450 price=1800 tflops=82.6
F
expect2 "no fleet" "needs --fleet FILE or --hosts N"
expect2 "unknown flag" "unknown option or missing value: '--bogus'" --hosts 2 --bogus
expect2 "bad number" "--runs 'x' is not a whole number" --hosts 2 --runs x
expect2 "bad failure model" "failure model 'fast' is none of" --hosts 2 --failures fast
expect2 "trace alone" "go together" --hosts 2 --trace "$work/fleet.txt"
expect2 "missing fleet" "fleet" --fleet "$work/nowhere"
printf 'hosts 2\ncard model=x count=3 colour=red\n' >"$work/bad1.txt"
expect2 "unknown field" "bad1.txt:2: unknown field" --fleet "$work/bad1.txt"
printf 'hosts 2\ncard model=x count=3\n' >"$work/bad2.txt"
expect2 "cards among hosts" "3 cards do not divide evenly among 2 hosts" --fleet "$work/bad2.txt"
mkfifo "$work/fifo"
expect2 "a FIFO" "not a regular file\|FIFO" --fleet "$work/fifo"
printf '{"steps": 10' >"$work/bad.json"
expect2 "summary not JSON" "bad.json: line 1" --hosts 2 --summary "$work/bad.json"

# --- the worked example -------------------------------------------------------------------------
args=(--fleet "$work/fleet.txt" --failures meta-rsc --min-hosts 3 --spares-sweep 2
      --step-time 0.1 --samples-per-step 256 --samples 1e9 --new "$work/new.txt" --seed 5)
if "$RK" plan "${args[@]}" >"$work/table" 2>"$work/err" && grep -q "^goodput  *0\.[0-9]" "$work/table" &&
   grep -q "^cost per million samples" "$work/table" && grep -q "^new cards: cost per million" "$work/table"; then
  ok "worked example: a table with goodput, cost and the new cards"
else bad "worked example: $(cat "$work/table" "$work/err" | head -c 400)"; fi
"$RK" plan "${args[@]}" --json >"$work/a.json" 2>"$work/err"; st=$?
"$RK" plan "${args[@]}" --json >"$work/b.json" 2>>"$work/err"
if [[ $st == 0 ]] && cmp -s "$work/a.json" "$work/b.json"; then ok "the same seed, the same JSON"
else bad "JSON: exit $st, $(head -c 300 "$work/err")"; fi
it_count python3 - "$work/a.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
s, n = d["stats"], d["new"]
def check(cond, msg): print(("ok - " if cond else "FAIL - ") + msg)
check(0 < s["goodput_min"] <= s["goodput_mean"] <= s["goodput_max"] <= 1, f"goodput {s['goodput_mean']:.4f} in [min, max]")
check(s["finished"] == s["runs"] == 8, "every run finished its 1e9 samples")
check(len(d["goodput_by_spares"]) == 3 and d["goodput_by_spares"][1] >= d["goodput_by_spares"][0], f"spares help: {d['goodput_by_spares']}")
check(d["cost_per_million_samples"] > 0 and n["cost_per_million_samples"] > 0, "both costs per million samples")
check(abs(n["step_s"] / (0.1 * 20 * 8.2 / (4 * 82.6)) - 1) < 1e-6, "the new cards' step scaled by tflops")
PY

# --- an rk run summary as the job -------------------------------------------------------------
printf '{"outcome":"done","wall_s":680,"productive_s":629,"goodput":0.925,"steps":22611,"final_ranks":4,"restarts":20,"recovery_median_s":1.15,"recovery":"memory","snapshot_bytes_peak":4194304}' >"$work/summary.json"
"$RK" plan --hosts 1 --gpus-per-host 4 --failures exp:480 --summary "$work/summary.json" --days 0.2 --runs 4 --json >"$work/s.json" 2>"$work/err"; st=$?
it_count python3 - "$work/s.json" "$st" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
def check(cond, msg): print(("ok - " if cond else "FAIL - ") + msg)
check(sys.argv[2] == "0", "summary read")
check(abs(d["step_s"] / (629 / 22611) - 1) < 1e-6 and d["recovery"] == "memory", f"step {d['step_s']:.5f} s and memory recovery from the summary")
check(abs(d["snap_every_s"] / (10 * 629 / 22611) - 1) < 1e-6 and "best_snap_every_s" in d, "snapshots every 10 steps, and their interval swept")
PY

# --- the InfiniteHBD trace ----------------------------------------------------------------------
if [[ -r $TRACE ]]; then
  "$RK" plan --hosts 400 --gpus-per-host 8 --min-hosts 1 --failures stepfun-trace --trace "$TRACE" \
    --days 348.9798 --runs 1 --json >"$work/t.json" 2>"$work/err"; st=$?
  it_count python3 - "$work/t.json" "$st" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(("ok - " if sys.argv[2] == "0" and 500 < d["stats"]["failures_mean"] <= 584 else "FAIL - ") + f"trace replayed: {d['stats']['failures_mean']:.0f} host losses hit the job (584 faults, 2 on a node already down)")
PY
else
  echo "skip - the InfiniteHBD trace: $TRACE absent (set RK_INFINITEHBD_DIR)"
fi
it_finish
