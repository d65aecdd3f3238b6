#!/usr/bin/env bash
# The snapshot memory seen (docs/recovery.md "Memory, seen", docs/run.md, docs/metrics.md),
# with real Open MPI ranks of `rk train` under rk run (snapshots every step):
# (1) a job with a crash and a hang relaunched from node memory: the events file has one
#     snapshot_on (the bytes, each rank's generations), one snapshot_held a relaunch and one
#     snapshot_peak at the end, and no snapshot_off; the summary says recovery memory, snapshots
#     on, the peak (the snapshot_peak note's bytes), restores {memory: 2, disk: 0}; the
#     --metrics-file (which exists while the job runs) passes `promtool check metrics` and says
#     the same peak, 2 relaunches from memory and the last step; rk report's page shows the
#     recovery mode, the peak and the restores.
# (2) RAM short (RK_SNAP_MEMAVAIL_BYTES=1, the test override of MemAvailable): exactly one
#     snapshot_off naming the RAM, the relaunch after a crash restores from disk, the job
#     finishes with the fault-free run's weights, the summary says snapshots off and restores
#     {memory: 0, disk: 1}.
# (3) --metrics-file in a directory that does not exist: exit 2, the directory named, nothing
#     made. Skips (77) without mpirun, promtool or data.
set -u
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
command -v promtool >/dev/null || { echo "SKIP: promtool not found (install prometheus)"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_need_data
it_init it_snapmem
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none

python3 "$RK_SRC/tests/make_subset.py" "$DATA" "$work/sub" 3200 500 || { bad "make subset"; exit 1; }
worker=("$RK" train --model mlp --data "$work/sub" --threads 1 --seed 3 --max-steps 90
        --epochs 3 --no-eval --ckpt-every 40)
export RK_SNAP_EVERY=1

# sup NAME [rk run flags...]: 2 ranks under rk run, the run's files in $work/NAME/
sup() {
  local name=$1; shift
  mkdir -p "$work/$name"
  "$RK" run -n 2 --ckpt-dir "$work/$name/ck" --heartbeat-timeout 3 --failure-threshold 9 \
    --events "$work/$name/events.jsonl" --summary-json "$work/$name/summary.json" \
    --steps "$work/$name/steps.jsonl" "$@" \
    -- "${worker[@]}" --metrics-json "$work/$name/train.json" >"$work/$name.out" 2>&1
}

if sup ref --recovery disk; then ok "the fault-free run finishes"
else bad "fault-free run: exit $?: $(tail -5 "$work/ref.out")"; fi
ref=$(json "$work/ref/train.json" weights_xxh64)

# --- (1) memory: a crash and a hang, the metrics file ---------------------------------------
prom=$work/mem/rk_run.prom
sup mem --metrics-file "$prom" --inject crash@step=30:rank=1,hang@step=60:rank=0 &
sp=$!
pids+=("$sp")
# the metrics file is there while the job runs (rk run writes it before the first launch)
wait_for "[[ -s '$prom' ]] || ! kill -0 $sp 2>/dev/null" 120
if kill -0 "$sp" 2>/dev/null && [[ -s $prom ]]; then
  ok "the metrics file exists while the job runs"
  promtool check metrics <"$prom" >"$work/promtool1.out" 2>&1 \
    && ok "promtool check metrics: the file written during the run is clean" \
    || bad "promtool during the run: $(cat "$work/promtool1.out")"
else
  bad "no metrics file while the job ran"
fi
wait "$sp"
st=$?
[[ $st == 0 ]] && ok "memory: the job with a crash and a hang finishes" \
  || bad "memory: exit $st: $(tail -8 "$work/mem.out")"
h=$(json "$work/mem/train.json" weights_xxh64 2>/dev/null)
[[ -n $h && $h == "$ref" ]] && ok "memory: weights_xxh64 $h equals the fault-free run's" \
  || bad "memory: weights_xxh64 '$h' differs from the fault-free $ref"
promtool check metrics <"$prom" >"$work/promtool2.out" 2>&1 \
  && ok "promtool check metrics: the final file is clean" \
  || bad "promtool at the end: $(cat "$work/promtool2.out")"
it_count python3 - "$work/mem" "$prom" <<'PY'
import json, re, sys
d, prom = sys.argv[1], sys.argv[2]
ev = [json.loads(l) for l in open(f"{d}/events.jsonl")]
s = json.load(open(f"{d}/summary.json"))
def check(c, msg):
    print(("ok - " if c else "FAIL - ") + msg)
by = lambda k: [e for e in ev if e["kind"] == k]
on, held, peak = by("snapshot_on"), by("snapshot_held"), by("snapshot_peak")
rel = [e for e in ev if e["action"] == "relaunch"]
check(len(on) == 1 and re.search(r"^snapshots in memory: [1-9][0-9]* bytes .*rank 0: [12] x [0-9.]+ MiB, rank 1: [12] x", on[0]["detail"]),
      f"one snapshot_on with the bytes and each rank's generations: {[e['detail'] for e in on]}")
check(len(rel) == 2 and all("resumed from node memory" in e["detail"] for e in rel),
      f"2 relaunches, both from node memory: {[e['detail'][-40:] for e in rel]}")
check(len(held) == 2 and all(re.search(r"^launch [01] ended holding [1-9][0-9]* bytes", e["detail"]) for e in held),
      f"one snapshot_held a relaunch: {[e['detail'][:60] for e in held]}")
m = re.search(r"peaked at ([0-9]+) bytes", peak[0]["detail"]) if len(peak) == 1 else None
check(m and ev[-1]["kind"] == "snapshot_peak", f"one snapshot_peak, the last line: {[e['detail'] for e in peak]}")
check(not by("snapshot_off"), "no snapshot_off")
check(all(e["rank"] is None and e["action"] == "none" for e in on + held + peak), "the notes blame no rank")
check(s.get("recovery") == "memory" and s.get("snapshots") == "on", f"summary: recovery {s.get('recovery')}, snapshots {s.get('snapshots')}")
check(m and s.get("snapshot_bytes_peak") == int(m.group(1)) > 0,
      f"summary: snapshot_bytes_peak {s.get('snapshot_bytes_peak')} is the note's peak")
check(s.get("restores") == {"memory": 2, "disk": 0, "in_place": 0}, f"summary: restores {s.get('restores')}")
check(not any(k.startswith("snapshot_") for k in s["incidents"]), f"the notes are not incidents: {s['incidents']}")
text = open(prom).read()
val = lambda pat: (re.search(r"^" + re.escape(pat) + r" ([0-9.e+]+)$", text, re.M) or [None, None])[1]
check(val("rk_run_snapshot_bytes_peak") == str(s["snapshot_bytes_peak"]), f"metric peak {val('rk_run_snapshot_bytes_peak')}")
check(val('rk_run_relaunches_total{source="memory"}') == "2" and val('rk_run_relaunches_total{source="disk"}') == "0",
      "metrics: 2 relaunches from memory, 0 from disk")
check(val("rk_run_restarts_total") == "2", f"metrics: rk_run_restarts_total {val('rk_run_restarts_total')}")
check(val("rk_run_step") == str(s["steps"]), f"metrics: rk_run_step {val('rk_run_step')} is the summary's {s['steps']}")
check(val('rk_run_info{recovery="memory",snapshots="on"}') == "1", "metrics: rk_run_info says memory, on")
check(val("rk_run_snapshot_bytes") is not None, "metrics: rk_run_snapshot_bytes")
PY
if "$RK" report "$work/mem" -o "$work/mem.html" >"$work/report.out" 2>&1; then
  peak=$(json "$work/mem/summary.json" snapshot_bytes_peak)
  mibs=$(python3 -c "print('%.1f MiB' % ($peak / 1048576))")
  grep -q "<dt>recovery</dt><dd>memory (snapshots on)</dd>" "$work/mem.html" \
    && grep -q "<dt>snapshot memory peak</dt><dd>$mibs</dd>" "$work/mem.html" \
    && grep -q "<dt>restores memory / disk</dt><dd>2 / 0</dd>" "$work/mem.html" \
    && ok "rk report: recovery memory (snapshots on), peak $mibs, restores 2 / 0" \
    || bad "rk report's facts: $(grep -o '<dl class="facts">.*</dl>' "$work/mem.html")"
else
  bad "rk report: $(cat "$work/report.out")"
fi

# --- (2) RAM short: one snapshot_off naming the RAM, disk only, the fault-free weights ------
if RK_SNAP_MEMAVAIL_BYTES=1 sup ram --metrics-file "$work/ram/rk_run.prom" --inject crash@step=50:rank=1
then ok "RAM short: the job finishes"; else bad "RAM short: exit $?: $(tail -8 "$work/ram.out")"; fi
h=$(json "$work/ram/train.json" weights_xxh64 2>/dev/null)
[[ -n $h && $h == "$ref" ]] && ok "RAM short: weights_xxh64 $h equals the fault-free run's" \
  || bad "RAM short: weights_xxh64 '$h' differs from the fault-free $ref"
it_count python3 - "$work/ram" <<'PY'
import json, sys
d = sys.argv[1]
ev = [json.loads(l) for l in open(f"{d}/events.jsonl")]
s = json.load(open(f"{d}/summary.json"))
def check(c, msg):
    print(("ok - " if c else "FAIL - ") + msg)
off = [e for e in ev if e["kind"] == "snapshot_off"]
check(len(off) == 1, f"{len(off)} snapshot_off event(s), one wanted")
check(off and "of RAM" in off[0]["detail"] and "MemAvailable, from RK_SNAP_MEMAVAIL_BYTES" in off[0]["detail"]
      and off[0]["action"] == "disk_only" and off[0]["rank"] is None,
      f"it names the RAM, says disk_only, blames no rank: {[e['detail'] for e in off]}")
rel = [e for e in ev if e["action"] == "relaunch"]
check(len(rel) == 1 and "resumed from disk checkpoint" in rel[0]["detail"], f"the relaunch resumed from disk: {[e['detail'][-50:] for e in rel]}")
check(s.get("recovery") == "memory" and s.get("snapshots") == "off", f"summary: recovery {s.get('recovery')}, snapshots {s.get('snapshots')}")
check(s.get("restores") == {"memory": 0, "disk": 1, "in_place": 0}, f"summary: restores {s.get('restores')}")
PY
grep -q '^rk_run_info{recovery="memory",snapshots="off"} 1$' "$work/ram/rk_run.prom" \
  && grep -q '^rk_run_relaunches_total{source="disk"} 1$' "$work/ram/rk_run.prom" \
  && grep -q '^rk_run_snapshot_bytes 0$' "$work/ram/rk_run.prom" \
  && ok "metrics: snapshots off (0 bytes held once removed), 1 relaunch from disk" \
  || bad "metrics: $(cat "$work/ram/rk_run.prom")"

# --- (3) a metrics file whose directory is missing: exit 2, nothing made --------------------
"$RK" run -n 1 --metrics-file "$work/nodir/m.prom" --events "$work/nodir.events" -- true \
  >"$work/nodir.out" 2>&1
st=$?
[[ $st == 2 ]] && grep -q -- "--metrics-file $work/nodir/m.prom: its directory $work/nodir does not exist" "$work/nodir.out" \
  && [[ ! -e $work/nodir && ! -e $work/nodir.events ]] \
  && ok "--metrics-file in a missing directory: exit 2, named, nothing made" \
  || bad "missing directory: exit $st: $(cat "$work/nodir.out")"

it_finish
