#!/usr/bin/env bash
# Integration test of the fleet failure detector, end to end through the real `rk` binary, on a
# small simulated fleet (docs/predict.md; 512 GPUs over 24 hours each, 200 failures to learn
# from: fewer and the LSTM does not yet beat the logistic regression): rk predict dataset (a
# span, so that failures are many), rk predict train, rk predict eval --json. Proves that the pipeline runs and writes
# what it says, that the predictor's F1 on the held-out
# GPUs beats both baselines' (the logistic regression on window summaries and the health
# score) on this fleet, and that this comparison can fail: the same model with a threshold that
# alarms on everything loses to them. Bad flags and inputs exit 2 with one line. About 2
# minutes on 2 cores (one BLAS thread); the full-size evaluation is bench/predict_fleet.
set -euo pipefail
RK=${RK:?set RK to the rk binary}
tmp=$(mktemp -d "${RK_TMP:-/tmp}/it_predict_fleet.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1
fail() { echo "it_predict_fleet: $*" >&2; exit 1; }

# ---- bad usage and input: exit 2, one line naming the problem --------------------------------
expect2() {
  local want=$1; shift
  set +e
  "$RK" predict "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  set -e
  [[ $rc -eq 2 ]] || fail "rk predict $* exited $rc, not 2"
  grep -q -- "$want" "$tmp/err" || fail "rk predict $*: no '$want' in: $(head -1 "$tmp/err")"
}
expect2 "needs -o MODEL" train "$tmp"
expect2 "does not exist" train "$tmp/none" -o "$tmp/m"
expect2 "fleet.json" train "$tmp" -o "$tmp/m"
expect2 "--horizon" train "$tmp" -o "$tmp/m" --horizon 0
expect2 "needs --model" eval "$tmp"
expect2 "--threshold" eval "$tmp" --model "$tmp/m" --threshold 2
expect2 "--span" dataset --sim 4 --hours 10 --span 5 -o "$tmp/d"
[[ $(wc -l <"$tmp/err") -ge 1 ]]

# ---- the pipeline ------------------------------------------------------------------------------
ds=$tmp/ds
"$RK" predict dataset --sim 512 --hours 24 --span 20000 --seed 3 -o "$ds" --json >"$tmp/ds.json"
python3 - "$tmp/ds.json" "$ds/fleet.json" <<'PY'
import json, sys
r, m = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert r["simulated"] is True and r["gpus"] == 512, r
failed = [d for d in m["devices"] if d["failure"]]
assert r["train"]["failed"] >= 150 and r["test"]["failed"] >= 50, r
# every failure lies inside its history, at least 6 hours in, most with warning signs before
for d in failed:
    f = d["failure"]
    assert 360 <= f["minute"] <= d["steps"], d
    p = f["precursor_minute"]
    assert p is None or f["minute"] - 6 * 60 <= p <= f["minute"], d
silent = sum(d["failure"]["precursor_minute"] is None for d in failed)
assert silent <= 0.1 * len(failed), (silent, len(failed))
PY
[[ -f $ds/gpu-0000.safetensors && -f $ds/events.jsonl ]] || fail "dataset files missing"

# fewer windows per failure than the defaults (every positive, 30 near, 30 random and 30 hard
# negatives) and at most 8 epochs, to stay under 2 minutes
"$RK" predict train "$ds" -o "$tmp/model.safetensors" --near 60 --negatives 0.5 --hard 0.5 \
  --epochs 8 --json >"$tmp/train.json" || fail "rk predict train failed"
[[ -f $tmp/model.safetensors && -f $tmp/model.safetensors.json ]] || fail "model files missing"
"$RK" predict eval "$ds" --model "$tmp/model.safetensors" --json >"$tmp/eval.json"
# the same model at a threshold that alarms everywhere (the table, not JSON): the comparison
# below must then fail
"$RK" predict eval "$ds" --model "$tmp/model.safetensors" --threshold 0.000001 >"$tmp/eval0.txt"

python3 - "$tmp/train.json" "$tmp/eval.json" "$tmp/eval0.txt" <<'PY'
import json, sys
tr, ev = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
table = open(sys.argv[3]).read().splitlines()
assert tr["window"] == 60 and tr["horizon"] == 60 and 0 < tr["predictor"]["threshold"] < 1, tr
assert ev["simulated"] is True and ev["split"] == "test" and ev["failures"] >= 50, ev
d = ev["detectors"]
for k in ("predictor", "logreg", "logreg_best_f1", "health_score"):
    m = d[k]
    for f in ("precision", "recall", "f1", "lead_mean_min", "lead_median_min",
              "false_alarms_per_gpu_day", "accuracy"):
        assert f in m and m[f] >= 0, (k, f, m)
    assert m["detected"] <= m["failures"] == ev["failures"], m
    assert 0 <= m["lead_mean_min"] <= ev["horizon"], m
# the baselines at both of the logistic regression's operating points
best_baseline = max(d["logreg"]["f1"], d["logreg_best_f1"]["f1"], d["health_score"]["f1"])
p, l, l2, h = (d[k]["f1"] for k in ("predictor", "logreg", "logreg_best_f1", "health_score"))
print(f"it_predict_fleet: test F1 predictor {p:.3f}, logistic regression {l:.3f} (at its best "
      f"val F1 {l2:.3f}), health score {h:.3f}; precision {d['predictor']['precision']:.3f}, "
      f"recall {d['predictor']['recall']:.3f}, mean lead {d['predictor']['lead_mean_min']:.1f} min")
assert p > best_baseline, "the predictor does not beat both baselines' F1"
# the control: alarming everywhere detects everything, but with false alarms on most GPUs its
# F1 falls below the baselines' (the same baselines: their rows do not change)
rows = {l.split("  ")[0].strip(): l.split() for l in table
        if l.startswith(("LSTM + attention", "logistic regression", "health score"))}
c = rows["LSTM + attention"]
threshold, precision, recall, f1 = (float(x) for x in c[3:7])
assert threshold < 0.001 and recall == 1.0, c
assert f1 <= best_baseline, "the comparison cannot fail: an always-on alarm still wins"
assert abs(float(rows["logistic regression"][3]) - d["logreg"]["precision"]) < 0.0006, rows
PY
echo "it_predict_fleet: ok"
