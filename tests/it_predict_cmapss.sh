#!/usr/bin/env bash
# rk predict end to end. Usage errors first (no data needed): a missing --data, an unknown
# flag, a bad number, a data directory that does not exist, and one whose train file is
# malformed: each exit 2 with one clear line. `rk predict dataset` on a small simulated fleet
# (its usage errors, then a manifest that agrees with the files). Then the real-data check of
# the predictor on NASA's C-MAPSS FD001 (../shared/data/cmapss beside the source tree, or
# RK_CMAPSS_DIR): the default configuration (docs/predict.md) reaches test RMSE <= 16 on the
# test engines' last cycles, and the JSON is complete. Skips (77) when the data is absent,
# naming the directory it looked in. About a minute on 2 cores.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_predict_cmapss
CMAPSS=${RK_CMAPSS_DIR:-$RK_SRC/../shared/data/cmapss}

# --- usage and bad input -------------------------------------------------------------------
expect2() { # NAME PATTERN ARGS...: exit 2 and PATTERN on stderr
  local name=$1 pat=$2; shift 2
  "$RK" predict "$@" >"$work/out" 2>"$work/err"; local st=$?
  if [[ $st == 2 ]] && grep -q -- "$pat" "$work/err"; then ok "$name (exit 2)"
  else bad "$name: exit $st: $(head -c 300 "$work/err")"; fi
}
expect2 "no subcommand" "usage: rk predict"
expect2 "unknown subcommand" "unknown subcommand 'fly'" fly
expect2 "cmapss without --data" "needs --data DIR" cmapss
expect2 "unknown flag" "unknown option or missing value: '--bogus'" cmapss --data "$work" --bogus
expect2 "bad window" "--window 'abc' is not a whole number" cmapss --data "$work" --window abc
expect2 "fractional ensemble" "--ensemble '1.5' is not a whole number" cmapss --data "$work" --ensemble 1.5
expect2 "missing data directory" "data directory '$work/nowhere' does not exist" cmapss --data "$work/nowhere"
expect2 "directory without the files" "train_FD001.txt" cmapss --data "$work"
printf '1 1 0 0 100 oops\n' >"$work/train_FD001.txt"
expect2 "malformed train file" "train_FD001.txt:1: column 6 (s1) is not a number" cmapss --data "$work"

# --- rk predict dataset: a small simulated fleet ---------------------------------------------
expect2 "dataset without --sim" "dataset needs --sim N" dataset --hours 1 -o "$work/ds"
expect2 "dataset without -o" "dataset needs -o DIR" dataset --sim 2 --hours 1
expect2 "dataset shares" "leave no devices for training" dataset --sim 2 --hours 1 --val 0.5 --test 0.5 -o "$work/ds"
"$RK" predict dataset --sim 5 --hours 3 --seed 2 -o "$work/ds" --json >"$work/ds.json" 2>"$work/ds.err"; st=$?
python3 - "$work/ds.json" "$work/ds/fleet.json" <<'PY' && [[ $st == 0 ]] && ok "dataset: 5 simulated GPUs x 3 h, manifest and files agree" || bad "dataset: exit $st: $(head -c 300 "$work/ds.err")"
import json, os, sys
r, m = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert r["simulated"] is True and m["simulated"] is True and r["gpus"] == 5 == len(m["devices"])
assert sum(r[k]["devices"] for k in ("train", "val", "test")) == 5
assert r["steps"] == sum(d["steps"] for d in m["devices"]) and r["steps"] <= 5 * 180
d = os.path.dirname(sys.argv[2])
for dev in m["devices"]:
    assert os.path.getsize(os.path.join(d, dev["file"])) > dev["steps"] * 12 * 5
PY

# --- the real-data check --------------------------------------------------------------------
if [[ ! -e $CMAPSS/train_FD001.txt ]]; then
  echo "SKIP: C-MAPSS FD001 not found in $CMAPSS (set RK_CMAPSS_DIR)"
  it_finish || exit 1
  exit 77
fi
start=$(date +%s)
"$RK" predict cmapss --data "$CMAPSS" --json >"$work/c.json" 2>"$work/c.err"; st=$?
took=$(( $(date +%s) - start ))
[[ $st == 0 ]] && ok "rk predict cmapss --json exits 0 (${took} s)" || bad "exit $st: $(tail -c 500 "$work/c.err")"
python3 - "$work/c.json" <<'PY' && ok "C-MAPSS FD001: test RMSE <= 16 (literature deep LSTM 16.14)" || bad "result: $(head -c 600 "$work/c.json")"
import json, math, sys
d = json.load(open(sys.argv[1]))
for k in ("test_rmse", "test_rmse_capped", "test_score", "val_rmse", "epochs", "seconds"):
    assert k in d and isinstance(d[k], (int, float)) and math.isfinite(d[k]), k
assert d["train_engines"] + d["val_engines"] == 100 and d["test_engines"] == 100, d
assert len(d["members"]) == d["ensemble"] and sum(m["epochs"] for m in d["members"]) == d["epochs"]
print(f"test RMSE {d['test_rmse']:.2f} (capped {d['test_rmse_capped']:.2f}), validation RMSE "
      f"{d['val_rmse']:.2f}, {d['epochs']} epochs, {d['seconds']:.0f} s")
assert d["test_rmse"] <= 16.0, d["test_rmse"]
PY
it_finish
