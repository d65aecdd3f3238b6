#!/usr/bin/env bash
# rk doctor and rk tune end to end: on a simulated fleet (every GPU marked simulated, the
# table and --json agree, exit 1 exactly when a GPU scores below the threshold), without
# NVML (one clear line, exit 1), with bad flags (exit 2), and through the real dlopen path
# against the test's fake libnvidia-ml (RK_NVML_LIB): a passive GeForce whose absent fields
# stay absent and a lost GPU that scores 0; rk tune --dry-run says what would change and
# changes nothing; an out-of-range setting is refused before anything is applied. The table
# shows the readings (bus id, serial, temperature, power, clocks, link, ECC, Xid; "-" where
# absent) within 80 columns and without colour when piped; --json matches the schema that
# docs/doctor-json.md documents (tests/doctor_json_check.py), also without NVML.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_health
fake=${RK_BUILD:?}/tests/libfake_nvml.so
[[ -e $fake ]] || { echo "SKIP: $fake not built"; exit 77; }

# --- a simulated fleet ------------------------------------------------------------------
"$RK" doctor --sim 6 --seed 3 --samples 3 --interval 0.1 >"$work/d0" 2>&1; st=$?
[[ $st == 0 ]] && ok "fresh simulated fleet passes (exit 0)" || bad "exit $st: $(cat "$work/d0")"
[[ $(grep -c "(simulated)" "$work/d0") == 6 ]] && ok "every simulated GPU is marked" || bad "marks"
[[ $(grep -c '^       bus 00000000:0[0-5]:00.0  serial ' "$work/d0") == 6 ]] \
  && [[ $(grep -cE '^       [0-9]+ C  [0-9]+/[0-9]+ W  fan ([0-9]+%|-)  SM [0-9]+ MHz  mem [0-9]+ MHz$' "$work/d0") == 6 ]] \
  && [[ $(grep -cE '^       PCIe [0-9]/[0-9] x[0-9]+/[0-9]+  ECC [-0-9]+/[-0-9]+  retired [-0-9]+  Xid [0-9]+' "$work/d0") == 6 ]] \
  && ok "the table shows each GPU's bus id, serial and readings" || bad "readings: $(cat "$work/d0")"
awk 'length($0) > 80 { exit 1 }' "$work/d0" && ! grep -q $'\033' "$work/d0" \
  && ok "the table fits 80 columns, no colour when piped" || bad "width or colour: $(cat "$work/d0")"
"$RK" doctor --sim 6 --seed 3 --age 30000 --samples 3 --interval 0.1 --json >"$work/d0.json" 2>&1; st=$?
python3 - "$work/d0.json" "$st" <<'PY' && ok "by default the simulated GPUs are idle and report only NVML's fields" || bad "defaults: exit $st: $(head -c 300 "$work/d0.json")"
import json, sys
g = json.load(open(sys.argv[1]))["gpus"]
assert len(g) == 6
for x in g:
    r = x["readings"]
    assert r["util_pct"] <= 5, x
    assert "vrm_ripple_v" not in r and "fan_vibration_hz" not in r, x
    if "GeForce" in x["name"]:
        assert not any(k in r for k in ("ecc_corrected", "ecc_uncorrected", "retired_pages",
                                        "retired_pending", "remapped_rows")), x
PY
# the worn fleet's GPUs in a job, with the VRM and fan sensors fitted: some fail
worn=(--sim 6 --seed 3 --age 30000 --sim-load busy --sim-sensors)
"$RK" doctor "${worn[@]}" --samples 3 --interval 0.1 --json >"$work/d1.json" 2>"$work/d1.err"; st=$?
python3 - "$work/d1.json" "$st" <<'PY' && ok "worn fleet: JSON scores, findings, exit 1 because GPUs fail" || bad "json: $(head -c 300 "$work/d1.json")"
import json, sys
d = json.load(open(sys.argv[1]))
st = int(sys.argv[2])
g = d["gpus"]
assert d["backend"] == "sim" and d["threshold"] == 60 and len(g) == 6
for x in g:
    assert x["simulated"] is True and 0 <= x["score"] <= 100 and x["pass"] == (x["score"] >= 60)
    for f in x["findings"]:
        assert f["severity"] in ("info", "warn", "crit") and f["code"] and f["action"], f
    assert "ecc_corrected" not in x["readings"] or not x["name"].startswith("NVIDIA GeForce GTX"), x
    assert "serial" not in x or x["name"].startswith("Tesla"), x
    assert "vrm_ripple_v" in x["readings"], x
failing = [x["index"] for x in g if not x["pass"]]
assert failing and st == 1, (failing, st)
print(f"scores {[x['score'] for x in g]}, failing {failing}")
PY
check_json() { # FILE WHAT: the report matches docs/doctor-json.md's schema
  if python3 "$RK_SRC/tests/doctor_json_check.py" "$RK_SRC/docs/doctor-json.md" "$1" >"$work/schema" 2>&1
  then ok "$2: --json matches docs/doctor-json.md"; else bad "$2: $(head -5 "$work/schema")"; fi
}
check_json "$work/d1.json" "worn simulated fleet"
"$RK" doctor "${worn[@]}" --samples 3 --interval 0.1 --threshold 0 >/dev/null 2>&1
[[ $? == 0 ]] && ok "--threshold 0: every GPU passes" || bad "threshold 0"

# --- no NVML, bad flags -----------------------------------------------------------------
RK_NVML_LIB=$work/none.so "$RK" doctor >"$work/n" 2>&1; st=$?
[[ $st == 1 ]] && grep -q "NVML not available" "$work/n" && ok "no NVML: one clear line, exit 1" \
  || bad "no nvml: exit $st: $(cat "$work/n")"
RK_NVML_LIB=$work/none.so "$RK" doctor --json >"$work/n.json" 2>/dev/null; st=$?
python3 - "$work/n.json" "$st" <<'PY' && ok "no NVML, --json: gpus [] and the error on stdout, exit 1" || bad "no nvml json: $(cat "$work/n.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert int(sys.argv[2]) == 1 and d["gpus"] == [] and d["error"].startswith("NVML not available"), d
assert d["host"] and d["version"] and d["time"].endswith("Z"), d
PY
check_json "$work/n.json" "no NVML"
for args in "--sim 0" "--sim 2 --threshold 101" "--bogus" "--sim 2 extra" "--sim 2 --sim-load hot" \
  "--sim-load busy" "--sim-sensors"; do
  "$RK" doctor $args >/dev/null 2>&1
  [[ $? == 2 ]] && ok "doctor $args: exit 2" || bad "doctor $args"
done
RK_NVML_LIB=$work/none.so "$RK" tune --dry-run >"$work/t0" 2>&1; st=$?
[[ $st == 1 ]] && grep -q "NVML not available" "$work/t0" && ok "tune without NVML: exit 1" || bad "tune no nvml: $st"
"$RK" tune --bogus >/dev/null 2>&1
[[ $? == 2 ]] && ok "tune --bogus: exit 2" || bad "tune bogus"

# --- the real dlopen path against the fake driver ---------------------------------------
RK_NVML_LIB=$fake "$RK" doctor --samples 2 --interval 0.1 --json >"$work/f.json" 2>&1; st=$?
python3 - "$work/f.json" "$st" <<'PY' && ok "fake driver: absent fields absent, the lost GPU scores 0" || bad "fake: $(head -c 400 "$work/f.json")"
import json, sys
d = json.load(open(sys.argv[1]))
g = d["gpus"]
assert d["backend"] == "nvml" and len(g) == 2 and int(sys.argv[2]) == 1
a, lost = g[0], g[1]
r = a["readings"]
assert a["simulated"] is False and "temp_c" in r and "fan_pct" not in r \
    and "ecc_corrected" not in r, r
assert lost["readings"] == {"lost": True}, lost["readings"]
assert lost["score"] == 0 and lost["findings"][0]["code"] == "gpu_lost"
print(f"GPU 0 score {a['score']}, readings {sorted(r)}")
PY
check_json "$work/f.json" "fake driver"
RK_NVML_LIB=$fake "$RK" doctor --samples 2 --interval 0.1 >"$work/f.txt" 2>&1
grep -qE '^       [0-9]+ C  [0-9]+/[0-9]+ W  fan -  ' "$work/f.txt" \
  && ok "fake driver: the passive card's fan shows as '-'" || bad "fake table: $(cat "$work/f.txt")"
FAKE_NVML_BOARD=ampere RK_NVML_LIB=$fake "$RK" tune --gpu 0 --lock-clocks 1506 --power-limit 150 --dry-run >"$work/t1" 2>&1; st=$?
[[ $st == 0 ]] && grep -q "SM clocks locked 1506 MHz" "$work/t1" && grep -q "power limit 150 W" "$work/t1" \
  && grep -q "dry run: nothing changed" "$work/t1" && ok "tune --dry-run says what would change" \
  || bad "tune dry run: exit $st: $(cat "$work/t1")"
RK_NVML_LIB=$fake "$RK" tune --gpu 0 --power-limit 5000 >"$work/t2" 2>&1; st=$?
[[ $st == 2 ]] && ok "an out-of-range power limit is refused (exit 2)" || bad "tune range: $st $(cat "$work/t2")"
# The fake's default GPU 0 is a Pascal GeForce: NVML answers NOT_SUPPORTED to locked clocks.
# rk tune knows before asking and changes nothing; the doctor's advice and the table name
# what the card does allow (docs/tune.md, "Which cards can").
RK_NVML_LIB=$fake "$RK" tune --gpu 0 --lock-clocks 1506 --power-limit 150 >"$work/t3" 2>&1; st=$?
[[ $st == 2 ]] && grep -q "locked clocks: not supported on Pascal; it allows --power-limit 90-217 W" "$work/t3" \
  && grep -q "nothing changed" "$work/t3" && ! grep -q "power limit 150 W.*done" "$work/t3" \
  && ok "Pascal: a clock lock is refused before anything changes (exit 2)" \
  || bad "Pascal lock: exit $st: $(cat "$work/t3")"
RK_NVML_LIB=$fake "$RK" tune --gpu 0 >"$work/t4" 2>&1
grep -q "^GPU 0: Pascal GeForce: can set --power-limit 90-217 W; locks no clocks" "$work/t4" \
  && ok "Pascal: rk tune shows what the card allows" || bad "Pascal routes: $(cat "$work/t4")"
FAKE_NVML_BOARD=pascal-offsets RK_NVML_LIB=$fake "$RK" tune --gpu 0 --clock-offset -100 --dry-run >"$work/t5" 2>&1; st=$?
[[ $st == 0 ]] && grep -q "clock offset -100 MHz (now +0 MHz, allowed -500..+1000 MHz)" "$work/t5" \
  && ok "Pascal with a driver that offers offsets: --clock-offset" || bad "offset: $st $(cat "$work/t5")"
RK_NVML_LIB=$fake "$RK" tune --gpu 0 --clock-offset -100 >"$work/t6" 2>&1; st=$?
[[ $st == 2 ]] && grep -q "a clock offset: not offered by this driver on Pascal" "$work/t6" \
  && ok "Pascal without offsets: --clock-offset refused (exit 2)" || bad "no offset: $st $(cat "$work/t6")"
for board in pascal ampere; do
  FAKE_NVML_BOARD=$board RK_NVML_LIB=$fake "$RK" doctor --samples 2 --interval 0.1 --json >"$work/b-$board.json" 2>/dev/null
  check_json "$work/b-$board.json" "fake $board"
done
python3 - "$work/b-pascal.json" "$work/b-ampere.json" <<'PY' && ok "the doctor's advice fits the card: power limit on Pascal, locked clocks on Ampere" || bad "advice by architecture"
import json, sys
def gpu0(p):
    return json.load(open(p))["gpus"][0]
p, a = gpu0(sys.argv[1]), gpu0(sys.argv[2])
pa = [f["action"] for f in p["findings"] if f["code"] == "power_capped"][0]
aa = [f["action"] for f in a["findings"] if f["code"] == "power_capped"][0]
assert p["architecture"] == "Pascal" and p["tune"] == ["power_limit"] and p["geforce"], p
assert a["architecture"] == "Ampere" and "lock_clocks" in a["tune"], a
assert "--power-limit" in pa and "--lock-clocks" not in pa, pa
assert "--lock-clocks" in aa, aa
print("Pascal:", pa, "| Ampere:", aa)
PY
it_finish
