#!/usr/bin/env bash
# rk exporter --predictor over real HTTP, with untrained models made by tests/mkmodel.c (their
# probabilities mean nothing; where and how they are served is what is checked): (1) a model
# file that is missing, is not a model, or is a regression model is refused with exit 2
# naming the file; (2) `rk exporter --sim 16 --time-scale 60 --interval 0.2s --predictor
# MODEL` (a 5-minute window) says so on start, serves no rk_gpu_failure_probability before 5
# simulated minutes, then one per GPU, in [0, 1], with the labels of rk_gpu_up; each GPU's
# findings follow the score's rule for it (failure_predicted 45 at p >= 0.5, failure_risk
# round(50 p) at 0.2 <= p < 0.5, none below), and promtool check metrics finds nothing wrong;
# (3) a model biased to p ~ 0.99 takes every GPU's score below the threshold 60 with
# failure_predicted, and the exporter says so on stderr; (4) a collection cycle longer than a
# simulated minute draws a warning; (5) `rk doctor --predictor`: a missing model is exit 2, a
# check shorter than the window says it has no prediction (JSON null) and has no predictor
# finding, a check that spans it gives a probability whose findings follow the rule. Skips (77)
# without promtool or python3.
set -u
for tool in promtool python3; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not found (install prometheus, python3)"; exit 77; }
done
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_exporter_predict
MKMODEL=${RK_MKMODEL:?}

# stop PID: SIGTERM, wait up to 5 s; sets $stopped to the exit status or "running"
stop() {
  kill -TERM "$1"
  for _ in $(seq 1 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$1" 2>/dev/null; then stopped=running; return; fi
  wait "$1"
  stopped=$?
}

"$MKMODEL" "$work/m5.safetensors" 5 8 || { bad "mkmodel failed"; it_finish; exit; }
"$MKMODEL" "$work/hi.safetensors" 5 8 6 || { bad "mkmodel failed"; it_finish; exit; }
"$MKMODEL" "$work/rul.safetensors" 5 8 0 regress || { bad "mkmodel failed"; it_finish; exit; }

# --- (1) model files it cannot use ----------------------------------------------------------
refused() {
  local want=$1 file=$2
  "$RK" exporter --sim 2 --listen 127.0.0.1:0 --predictor "$file" >"$work/u.out" 2>"$work/u.err"
  local rc=$?
  if [[ $rc -eq 2 ]] && grep -qF -- "$file" "$work/u.err" && grep -q -- "$want" "$work/u.err" \
     && [[ $(wc -l <"$work/u.err") -eq 1 ]]; then
    ok "--predictor $(basename "$file"): exit 2, one line naming it ($(cat "$work/u.err"))"
  else bad "--predictor $(basename "$file"): exit $rc: $(head -3 "$work/u.err")"; fi
}
refused "no such file" "$work/absent.safetensors"
head -c 100 "$work/m5.safetensors" >"$work/cut.safetensors"
refused "" "$work/cut.safetensors"
printf 'not a model\n' >"$work/text.safetensors"
refused "" "$work/text.safetensors"
refused "regression" "$work/rul.safetensors"

# --- (2) a 16-GPU simulated fleet with a 5-minute window ------------------------------------
t_start=$(date +%s.%N)
if start main --sim 16 --time-scale 60 --interval 0.2s --listen 127.0.0.1:0 \
     --predictor "$work/m5.safetensors"; then
  ok "rk exporter --sim 16 --predictor listens on $addr"
else
  bad "rk exporter --predictor did not start: $(cat "$work/main.out" "$work/main.err")"
  it_finish; exit
fi
main_pid=$pid main_addr=$addr
grep -q "failure predictor .*m5.safetensors.* 5 minutes" "$work/main.out" \
  && ok "start line names the predictor and its 5-minute window" || bad "start: $(cat "$work/main.out")"

cat >"$work/checks.py" <<'EOF'
import re, sys, time, urllib.request

addr, step, out = sys.argv[1], sys.argv[2], sys.argv[3]
fails = 0

def check(cond, msg):
    global fails
    print(("ok - " if cond else "FAIL - ") + msg)
    fails += 0 if cond else 1

def scrape():
    return urllib.request.urlopen("http://%s/metrics" % addr, timeout=10).read().decode()

def series(text, name):
    """{labels: value} of one metric, labels as the raw label text"""
    got = {}
    for l in text.splitlines():
        m = re.match(r'^' + name + r'\{(.*)\} (\S+)$', l)
        if m:
            got[m.group(1)] = float(m.group(2))
    return got

def gpu(labels):
    return int(re.search(r'gpu="(\d+)"', labels).group(1))

if step == "early":
    # the exporter's clock runs 60x: 5 simulated minutes are 5 s after its start (argv[4])
    text = scrape()
    age = time.time() - float(sys.argv[4])
    probs = series(text, "rk_gpu_failure_probability")
    if age < 4:
        check(not probs and "rk_gpu_failure_probability" not in text,
              "no rk_gpu_failure_probability %.1f simulated minutes in, before the window is "
              "full (%d series)" % (age, len(probs)))
    else:
        print("# the early check came %.1f s after the start, too late to mean anything: skipped" % age)

elif step == "full":
    deadline = time.time() + 30
    while True:
        text = scrape()
        probs = series(text, "rk_gpu_failure_probability")
        if len(probs) == 16 or time.time() > deadline:
            break
        time.sleep(0.5)
    open(out, "w").write(text)
    check(len(probs) == 16, "rk_gpu_failure_probability for all 16 GPUs once 5 simulated "
          "minutes passed: %d series" % len(probs))
    check(all(0 <= v <= 1 for v in probs.values()), "every probability in [0, 1]: %s"
          % sorted(round(v, 3) for v in probs.values()))
    up = series(text, "rk_gpu_up")
    check(set(probs) == set(up), "the same labels as rk_gpu_up")
    check("# HELP rk_gpu_failure_probability A model's estimate" in text and "60 minutes" in text,
          "HELP says it is a model's estimate and names the horizon")
    findings = {}
    for labels, v in series(text, "rk_gpu_health_findings").items():
        code = re.search(r'code="([^"]*)"', labels).group(1)
        findings.setdefault(gpu(labels), {})[code] = v
    wrong = []
    for labels, p in probs.items():
        f = findings.get(gpu(labels), {})
        if p >= 0.5:
            good = f.get("failure_predicted") == 45 and "failure_risk" not in f
        elif p >= 0.2:
            good = f.get("failure_risk") == int(50 * p + 0.5) and "failure_predicted" not in f
        else:
            good = "failure_risk" not in f and "failure_predicted" not in f
        if not good:
            wrong.append((gpu(labels), p, f))
    check(not wrong, "each GPU's findings follow the score's rule for its probability%s"
          % (": %s" % wrong if wrong else ""))

elif step == "high":
    deadline = time.time() + 30
    while True:
        text = scrape()
        probs = series(text, "rk_gpu_failure_probability")
        if len(probs) == 4 or time.time() > deadline:
            break
        time.sleep(0.5)
    open(out, "w").write(text)
    scores = series(text, "rk_gpu_health_score")
    check(len(probs) == 4 and all(v >= 0.5 for v in probs.values()),
          "a biased model: every probability >= 0.5: %s" % sorted(probs.values()))
    check(len(scores) == 4 and all(v < 60 for v in scores.values()),
          "every score below the threshold 60: %s" % sorted(scores.values()))
    pred = [l for l in series(text, "rk_gpu_health_findings")
            if 'code="failure_predicted",severity="crit"' in l]
    check(len(pred) == 4, "4 failure_predicted findings, crit: %d" % len(pred))

sys.exit(1 if fails else 0)
EOF

run_py() { it_count python3 "$work/checks.py" "$@"; }

promcheck() {
  local msg
  msg=$(promtool check metrics <"$1" 2>&1)
  if [[ $? -eq 0 && -z $msg ]]; then ok "promtool check metrics: nothing to report ($2)"
  else bad "promtool check metrics ($2): $msg"; fi
}

run_py "$main_addr" early "$work/m0.txt" "$t_start"
run_py "$main_addr" full "$work/m1.txt"
promcheck "$work/m1.txt" "16 GPUs with the predictor"
stop "$main_pid"
[[ $stopped == 0 ]] && ok "SIGTERM: exit 0" || bad "SIGTERM: $stopped"

# --- (3) a model that predicts every GPU fails ----------------------------------------------
if start high --sim 4 --time-scale 60 --interval 0.2s --listen 127.0.0.1:0 \
     --predictor "$work/hi.safetensors"; then
  run_py "$addr" high "$work/m2.txt"
  promcheck "$work/m2.txt" "every GPU predicted to fail"
  if grep -q "below the threshold 60: .*failure_predicted" "$work/high.err"; then
    ok "stderr reports GPUs below the threshold with failure_predicted"
  else bad "stderr: $(cat "$work/high.err")"; fi
  stop "$pid"
  [[ $stopped == 0 ]] && ok "SIGTERM: exit 0" || bad "SIGTERM: $stopped"
else
  bad "rk exporter with the biased model did not start: $(cat "$work/high.out" "$work/high.err")"
fi

# --- (4) cycles longer than the predictor's minute -------------------------------------------
if start slow --sim 2 --time-scale 600 --interval 1s --listen 127.0.0.1:0 \
     --predictor "$work/m5.safetensors"; then
  grep -q "warning: a collection cycle spans 600 simulated seconds" "$work/slow.err" \
    && ok "a 600 s simulated cycle draws a warning" || bad "no warning: $(cat "$work/slow.err")"
  stop "$pid"
else
  bad "rk exporter --time-scale 600 did not start: $(cat "$work/slow.out" "$work/slow.err")"
fi

# --- (5) rk doctor --predictor ----------------------------------------------------------------
"$RK" doctor --sim 2 --predictor "$work/absent.safetensors" >"$work/d.out" 2>"$work/d.err"
rc=$?
[[ $rc -eq 2 ]] && grep -q "absent.safetensors: no such file" "$work/d.err" \
  && ok "rk doctor --predictor with a missing file: exit 2 naming it" || bad "doctor: exit $rc: $(cat "$work/d.err")"
# 3 readings 0.1 s apart: under a simulated minute in all, no window
"$RK" doctor --sim 4 --seed 3 --samples 3 --interval 0.1 --json --predictor "$work/hi.safetensors" \
  >"$work/d1.json" 2>"$work/d1.err"
"$RK" doctor --sim 4 --seed 3 --samples 3 --interval 0.1 --json >"$work/d0.json" 2>/dev/null
"$RK" doctor --sim 4 --seed 3 --samples 3 --interval 0.1 --predictor "$work/hi.safetensors" \
  >"$work/d1.txt" 2>&1
# 6 readings 0.5 s apart: 6 simulated minutes, the 5-minute window is full
"$RK" doctor --sim 4 --seed 3 --samples 6 --json --predictor "$work/hi.safetensors" \
  >"$work/d2.json" 2>"$work/d2.err"
python3 - "$work/d0.json" "$work/d1.json" "$work/d2.json" >"$work/d.py.out" 2>&1 <<'EOF'
import json, sys
d0, d1, d2 = (json.load(open(p))["gpus"] for p in sys.argv[1:4])
def line(ok, msg):
    print(("ok - " if ok else "FAIL - ") + msg)
line(all(g["failure_probability"] is None and g["prediction_minutes"] < 5 for g in d1),
     "a short check: failure_probability null, fewer than 5 minutes seen: %s"
     % [g["prediction_minutes"] for g in d1])
line(not any(f["code"].startswith("failure_") for g in d1 for f in g["findings"])
     and "failure_probability" not in d0[0],
     "a short check has no predictor finding (and no key without --predictor)")
ps = [g["failure_probability"] for g in d2]
line(all(p is not None and 0.5 <= p <= 1 for p in ps), "a 6-minute check: probabilities %s" % ps)
line(all(any(f["code"] == "failure_predicted" and f["penalty"] == 45 for f in g["findings"])
         and not g["pass"] for g in d2), "every GPU fails with failure_predicted (45 points)")
EOF
while IFS= read -r l; do
  case $l in "ok - "*) ok "${l#ok - }" ;; "FAIL - "*) bad "${l#FAIL - }" ;; *) echo "$l" ;; esac
done <"$work/d.py.out"
grep -q "prediction: none: the predictor needs 5 minutes of readings, this check saw" "$work/d1.txt" \
  && ok "the table says a short check has no prediction" || bad "doctor table: $(cat "$work/d1.txt")"

it_finish
