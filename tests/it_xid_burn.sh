#!/usr/bin/env bash
# Past Xids and the burn verdict end to end, through the real dlopen path against the test's
# fake libnvidia-ml (RK_NVML_LIB; its GPU 0 is on bus 00000000:01:00.0, a GeForce without a
# serial, so burn records are keyed by its UUID). (1) A kernel log file (RK_KMSG_PATH) with
# Xid 79 twice and 48 once on that bus, an Xid on another bus, and a line a user wrote to
# /dev/kmsg (facility 1): rk doctor --json counts 3 (79 x2, 48 x1) for GPU 0 and the finding
# xid, the table shows "Xid 3 (79 x2, 48 x1)", and the exporter serves
# rk_gpu_xid_errors_total{xid="79"} 2 and {xid="48"} 1 however often it re-reads. (2) A burn
# state file (RK_BURN_STATE) with a FAULTY record for the card: doctor shows burn_failed and
# the burn, the exporter rk_gpu_burn_ok 0, and rk run --health nvml leaves the GPU out; the
# same run without the file admits it. A bad state file is one warning, no finding.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_xid_burn
fake=${RK_BUILD:?}/tests/libfake_nvml.so
[[ -e $fake ]] || { echo "SKIP: $fake not built"; exit 77; }
export RK_NVML_LIB=$fake

cat >"$work/kmsg" <<'EOF'
6,1,100,-;Linux version 6.1.0
 SUBSYSTEM=pci
3,2,200,-;NVRM: Xid (PCI:0000:01:00): 79, pid=1234, GPU has fallen off the bus.
3,3,300,-;NVRM: Xid (PCI:0000:01:00): 48, pid='<unknown>', name=<unknown>, DBE
3,4,400,-;NVRM: Xid (PCI:01:00.0): 79, pid=77, name=python3, GPU has fallen off the bus.
12,5,500,-;NVRM: Xid (PCI:0000:01:00): 79, pid=1, written by a user
3,6,600,-;NVRM: Xid (PCI:0000:05:00): 13, pid=9, another GPU's application error
EOF
export RK_KMSG_PATH=$work/kmsg
export RK_BURN_STATE=$work/none/burn.json # missing: no records

# --- (1) Xids since boot ------------------------------------------------------------------
"$RK" doctor --samples 2 --interval 0.1 --json >"$work/x.json" 2>"$work/x.err"; st=$?
python3 - "$work/x.json" "$st" <<'PY' && ok "doctor --json: Xid 3 (79 x2, 48 x1) on GPU 0's bus, the user's line not counted, finding xid, exit 1" || bad "doctor xids: $(head -c 600 "$work/x.json") $(cat "$work/x.err")"
import json, sys
d = json.load(open(sys.argv[1]))
g = d["gpus"][0]
r = g["readings"]
assert g["bus_id"] == "00000000:01:00.0", g
assert r["xid_count"] == 3 and r["last_xid"] == 79, r
assert r["xids"] == [{"xid": 79, "count": 2}, {"xid": 48, "count": 1}], r["xids"]
codes = [f["code"] for f in g["findings"]]
assert "xid" in codes and "burn_failed" not in codes and "burn" not in g, g
assert g["pass"] is False and int(sys.argv[2]) == 1, (g["score"], sys.argv[2])
PY
if python3 "$RK_SRC/tests/doctor_json_check.py" "$RK_SRC/docs/doctor-json.md" "$work/x.json" >"$work/schema" 2>&1
then ok "Xids: --json matches docs/doctor-json.md"; else bad "schema: $(head -5 "$work/schema")"; fi
"$RK" doctor --samples 1 >"$work/x.txt" 2>&1
grep -q "Xid 3 (79 x2, 48 x1)" "$work/x.txt" && ok "the table shows Xid 3 (79 x2, 48 x1)" \
  || bad "table: $(cat "$work/x.txt")"

scrape() { python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://$1/metrics', timeout=5).read().decode())"; }
series() { grep -E "^$1\{gpu=\"0\"[^}]*$2[^}]*\} " "$3" | awk '{print $NF}'; }

if start e1 --listen 127.0.0.1:0 --interval 200ms; then
  # several collections: the file is re-read each time, nothing counted twice
  it_collected "$addr" 5 || bad "exporter: fewer than 5 collections in 30 s"
  scrape "$addr" >"$work/m1" 2>&1
  [[ $(series rk_gpu_xid_errors_total 'xid="79"' "$work/m1") == 2 &&
     $(series rk_gpu_xid_errors_total 'xid="48"' "$work/m1") == 1 &&
     $(series rk_gpu_xid_events_total '' "$work/m1") == 3 ]] \
    && ok "exporter: rk_gpu_xid_errors_total{xid=\"79\"} 2, {xid=\"48\"} 1, events 3 after re-reads" \
    || bad "exporter xids: $(grep xid "$work/m1")"
  ! grep -q '^rk_gpu_burn_ok' "$work/m1" && ok "exporter: no rk_gpu_burn_ok without a record" \
    || bad "burn_ok without a record: $(grep burn "$work/m1")"
  kill -TERM "$pid"; wait "$pid" 2>/dev/null
  # the fake's GPU 1 is lost before its name is read: the event names it without "()"
  grep -q "GPU 1 is lost: reseat" "$work/e1.out" "$work/e1.err" && ! grep -q "GPU 1 ()" "$work/e1.out" "$work/e1.err" \
    && ok "exporter: the GPU lost before its name was read is 'GPU 1'" \
    || bad "lost GPU event: $(grep -h "GPU 1" "$work/e1.out" "$work/e1.err")"
else
  bad "exporter did not start: $(cat "$work/e1.out" "$work/e1.err")"
fi

# --- (2) the burn verdict -----------------------------------------------------------------
unset RK_KMSG_PATH
export RK_KMSG_PATH=$work/empty.kmsg # no Xids: the burn verdict alone decides
: >"$RK_KMSG_PATH"
mkdir -p "$work/state"
export RK_BURN_STATE=$work/state/burn.json
cat >"$RK_BURN_STATE" <<'EOF'
{
  "format": "rekindle-burn-state",
  "gpus": {
    "GPU-00000000-1070-0000-0000-000000000000": {
      "bad_addresses": 0,
      "duration_s": 600.5,
      "failed": "sgemm: 12 elements wrong in copies 3,7",
      "gflops": 7123.46,
      "name": "NVIDIA GeForce GTX 1070 Ti",
      "ok": false,
      "when": 1764660000.25,
      "wrong_elements": 12
    }
  },
  "version": 1
}
EOF
"$RK" doctor --samples 1 --json >"$work/b.json" 2>"$work/b.err"; st=$?
python3 - "$work/b.json" "$st" <<'PY' && ok "doctor --json: burn_failed (crit) and the FAULTY burn, below the threshold" || bad "doctor burn: $(head -c 600 "$work/b.json")"
import json, sys
d = json.load(open(sys.argv[1]))
g = d["gpus"][0]
f = [x for x in g["findings"] if x["code"] == "burn_failed"]
assert f and f[0]["severity"] == "crit" and "12 elements wrong" in f[0]["message"], g["findings"]
assert f[0]["action"] == "wrong arithmetic under load: retire or down-clock and burn again"
b = g["burn"]
assert b["ok"] is False and abs(b["ended_unix_s"] - 1764660000.25) < 1, b
assert b["failed"] == "sgemm: 12 elements wrong in copies 3,7", b
assert g["score"] < 60 and g["pass"] is False and int(sys.argv[2]) == 1
PY
if python3 "$RK_SRC/tests/doctor_json_check.py" "$RK_SRC/docs/doctor-json.md" "$work/b.json" >"$work/schema" 2>&1
then ok "burn: --json matches docs/doctor-json.md"; else bad "schema: $(head -5 "$work/schema")"; fi
"$RK" doctor --samples 1 >"$work/b.txt" 2>&1
grep -q "burn FAULTY, 2025-12-02 07:20 UTC" "$work/b.txt" && ok "the table shows the burn: FAULTY and when" \
  || bad "table burn: $(cat "$work/b.txt")"
if start e2 --listen 127.0.0.1:0 --interval 200ms; then
  it_collected "$addr" 2 || bad "exporter: fewer than 2 collections in 30 s"
  scrape "$addr" >"$work/m2" 2>&1
  [[ $(series rk_gpu_burn_ok '' "$work/m2") == 0 &&
     $(series rk_gpu_burn_timestamp_seconds '' "$work/m2") == 1764660000.25 ]] \
    && grep -q '^rk_gpu_health_findings{gpu="0".*code="burn_failed",severity="crit"} 50' "$work/m2" \
    && ok "exporter: rk_gpu_burn_ok 0, its timestamp, the burn_failed finding" \
    || bad "exporter burn: $(grep burn "$work/m2")"
  kill -TERM "$pid"; wait "$pid" 2>/dev/null
else
  bad "exporter did not start: $(cat "$work/e2.out" "$work/e2.err")"
fi
"$RK" run -n 1 --devices 0 --health nvml --ckpt-dir "$work/ck" --quiet -- true >"$work/r1" 2>&1; st=$?
[[ $st != 0 ]] && grep -q "device 0 left out of this launch: score [0-9]* (burn_failed" "$work/r1" \
  && ok "rk run --health nvml leaves the GPU with a FAULTY burn out (exit $st)" \
  || bad "gate: exit $st: $(cat "$work/r1")"
RK_BURN_STATE=$work/none/burn.json "$RK" run -n 1 --devices 0 --health nvml --ckpt-dir "$work/ck2" \
  --quiet -- true >"$work/r2" 2>&1; st=$?
! grep -q "left out" "$work/r2" && ok "without the record the same GPU is admitted" \
  || bad "gate without record: exit $st: $(cat "$work/r2")"

# a bad state file: one warning line naming it, no finding invented
echo '{"format": "rekindle-burn-state", "version": 1, "gpus": [' >"$RK_BURN_STATE"
"$RK" doctor --samples 2 --interval 0.1 --json >"$work/w.json" 2>"$work/w.err"
python3 - "$work/w.json" <<'PY' && [[ $(grep -c "burn" "$work/w.err") == 1 ]] \
  && grep -q "burn.json" "$work/w.err" && ok "a bad state file: one warning naming it, no burn finding" \
  || bad "bad state: $(cat "$work/w.err") $(head -c 300 "$work/w.json")"
import json, sys
g = json.load(open(sys.argv[1]))["gpus"][0]
assert "burn" not in g and not [f for f in g["findings"] if f["code"] == "burn_failed"], g
PY
it_finish
