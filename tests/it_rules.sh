#!/usr/bin/env bash
# Checks deploy/ without a running server: the scrape config and alert rules load in promtool,
# the rule unit tests pass (every alert fires on the GPU that deserves it, with its labels and
# annotations, and stays quiet for its neighbours), every alert has a `for:`, a severity and
# unit tests both firing and quiet, the rules and the Grafana dashboard use only metrics that
# docs/metrics.md lists, the dashboard is well-formed JSON with a templated data source and
# $gpu variable that its queries use, and every dashboard query parses as PromQL.
# Needs RK_SRC, RK_TMP (RK is not used); skips (77) without promtool.
set -u
command -v promtool >/dev/null || { echo "SKIP: promtool not found (install prometheus)"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_rules

prom=$RK_SRC/deploy/prometheus
dash=$RK_SRC/deploy/grafana/rekindle.json
metrics_doc=$RK_SRC/docs/metrics.md

# check NAME CMD...: the command succeeds; its output is shown when it does not.
check() {
  local name=$1; shift
  if "$@" >"$work/out" 2>&1; then ok "$name"
  else bad "$name: $(tail -c 2000 "$work/out")"; fi
}

check "promtool check config prometheus.yml" promtool check config "$prom/prometheus.yml"
check "promtool check rules rekindle.rules.yml" promtool check rules "$prom/rekindle.rules.yml"
check "promtool test rules rekindle.rules.test.yml" \
  promtool test rules "$prom/rekindle.rules.test.yml"

# The scrape config loads the rules file that the tests exercise, under the job name the
# RekindleExporterDown rule matches.
if grep -qE '^\s+- rekindle\.rules\.yml\s*$' "$prom/prometheus.yml" &&
   grep -qE '^\s+- job_name: rekindle\s*$' "$prom/prometheus.yml" &&
   grep -qF 'up{job="rekindle"}' "$prom/rekindle.rules.yml"; then
  ok "prometheus.yml loads rekindle.rules.yml and scrapes job rekindle"
else
  bad "prometheus.yml must list rekindle.rules.yml and a job named rekindle"
fi

check "rekindle.json is well-formed JSON" python3 -m json.tool "$dash"

# Structure of the rules and the dashboard (plain text scans: no YAML library needed).
cat >"$work/lint.py" <<'EOF'
import json, re, sys
rules_path, tests_path, dash_path, doc_path, out_rules = sys.argv[1:6]
problems = []
doc = open(doc_path).read()
known = set(re.findall(r"^\|\s*(rk_[a-z0-9_]+)\s*\|", doc, re.M))
if len(known) < 30:
    problems.append("docs/metrics.md: only %d metrics found in its table" % len(known))

def metrics_in(text):
    # rk_ names that are not recording rule outputs (those contain a colon)
    return set(m for m in re.findall(r"(?<![a-z0-9_:])rk_[a-z0-9_]+(?![a-z0-9_:])", text))

# -- rules: every alert has for:, a severity, summary and description naming gpu and $value.
rules = open(rules_path).read()
blocks = re.split(r"^\s+- (?=alert:|record:)", rules, flags=re.M)[1:]
alerts = []
for b in blocks:
    m = re.match(r"alert:\s*(\w+)", b)
    if not m:
        continue
    name = m.group(1)
    alerts.append(name)
    if not re.search(r"^\s+for:\s*\d+[smh]\s*$", b, re.M):
        problems.append("%s: no for:" % name)
    if not re.search(r"^\s+severity:\s*(warning|critical)\s*$", b, re.M):
        problems.append("%s: no severity label (warning or critical)" % name)
    for key in ("summary", "description"):
        m2 = re.search(r"^\s+%s:(.*?)(?=^\s+\w+:|\Z)" % key, b, re.M | re.S)
        if not m2:
            problems.append("%s: no %s annotation" % (name, key))
            continue
        text = m2.group(1)
        if "$value" not in text and "| query" not in text:
            problems.append("%s: %s shows no value ($value or a query)" % (name, key))
        if "$labels.gpu" not in text and name != "RekindleExporterDown":
            problems.append("%s: %s does not name the GPU ($labels.gpu)" % (name, key))
        if "$labels.instance" not in text:
            problems.append("%s: %s does not name the node ($labels.instance)" % (name, key))
want = {"RekindleGpuHealthLow", "RekindleGpuTemperatureHigh", "RekindleGpuHeatingFast",
        "RekindleGpuEccUncorrected", "RekindleGpuRetiredPagesPending",
        "RekindleGpuPcieDowntrained", "RekindleGpuCriticalXid", "RekindleGpuMemoryXid",
        "RekindleGpuLost",
        "RekindleGpuMissing", "RekindleExporterDown", "RekindleGpuFailurePredicted"}
for name in sorted(want - set(alerts)):
    problems.append("rules: alert %s is missing" % name)
for name in sorted(metrics_in(rules) - known):
    problems.append("rules: metric %s is not in docs/metrics.md" % name)

# -- rule tests: each alert is tested firing (non-empty exp_alerts) and quiet (exp_alerts: []).
tests = open(tests_path).read()
cases = re.findall(r"alertname:\s*(\w+)\s*\n\s*exp_alerts:\s*(\[\])?", tests)
for name in alerts:
    if not any(n == name and not empty for n, empty in cases):
        problems.append("tests: %s is never tested firing" % name)
    if not any(n == name and empty for n, empty in cases):
        problems.append("tests: %s is never tested quiet" % name)

# -- dashboard
d = json.load(open(dash_path))
if not 30 <= d.get("schemaVersion", 0) <= 39:
    problems.append("dashboard: schemaVersion %r (want about 37)" % d.get("schemaVersion"))
tvars = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
if tvars.get("datasource", {}).get("type") != "datasource" or \
        tvars["datasource"].get("query") != "prometheus":
    problems.append("dashboard: no templated prometheus data source variable 'datasource'")
if tvars.get("gpu", {}).get("type") != "query":
    problems.append("dashboard: no $gpu query variable")

def walk(panels):
    for p in panels:
        yield p
        yield from walk(p.get("panels", []))
exprs = []
titles = set()
for p in walk(d.get("panels", [])):
    if p.get("type") == "row":
        continue
    titles.add(p.get("title"))
    if p.get("datasource", {}).get("uid") != "${datasource}":
        problems.append("dashboard: panel %r does not use ${datasource}" % p.get("title"))
    if not p.get("targets"):
        problems.append("dashboard: panel %r has no queries" % p.get("title"))
    for t in p.get("targets", []):
        e = t.get("expr", "")
        exprs.append(e)
        for sel in re.finditer(r"(rk_gpu_[a-z0-9_]+)(\{[^}]*\})?", e):
            if '$gpu' not in (sel.group(2) or ""):
                problems.append("dashboard: %r: %s is not filtered by $gpu" %
                                (p.get("title"), sel.group(1)))
for v in tvars.values():
    q = v.get("query")
    if isinstance(q, dict):
        q = q.get("query", "")
    if v.get("type") == "query":
        exprs.append(q)
used = set()
for e in exprs:
    used |= metrics_in(e)
for name in sorted(used - known):
    problems.append("dashboard: metric %s is not in docs/metrics.md" % name)
# What the brief asks the dashboard to show, by metric.
for m in ("rk_gpu_health_score", "rk_gpu_temperature_celsius",
          "rk_gpu_temperature_rate_celsius_per_second", "rk_gpu_fan_speed_ratio",
          "rk_gpu_fan_vibration_hertz", "rk_gpu_power_watts", "rk_gpu_power_limit_watts",
          "rk_gpu_sm_clock_hertz", "rk_gpu_clock_event_active",
          "rk_gpu_ecc_uncorrected_errors_total", "rk_gpu_retired_pages",
          "rk_gpu_pcie_link_generation", "rk_gpu_pcie_link_width_max",
          "rk_gpu_pcie_replays_per_second", "rk_gpu_xid_events_total",
          "rk_gpu_vrm_ripple_volts", "rk_gpu_failure_probability"):
    if m not in used:
        problems.append("dashboard: no panel shows %s" % m)

# Every dashboard query as a recording rule, for promtool to parse as PromQL.
def concrete(e):
    e = e.replace("$__rate_interval", "1m").replace("${datasource}", "")
    return re.sub(r"\$\{?(\w+)\}?", ".*", e)
q = [e for e in exprs if not e.startswith("label_values(")]
groups = {"groups": [{"name": "dashboard", "rules": [
    {"record": "dashboard:query%d" % i, "expr": concrete(e)} for i, e in enumerate(q)]}]}
json.dump(groups, open(out_rules, "w"), indent=1)

print("%d alerts, %d rule tests, %d dashboard panels, %d queries, %d metrics documented"
      % (len(alerts), len(cases), len(titles), len(q), len(known)))
for p in problems:
    print("problem:", p)
sys.exit(1 if problems else 0)
EOF
check "alerts, rule tests and dashboard follow docs/metrics.md" \
  python3 "$work/lint.py" "$prom/rekindle.rules.yml" "$prom/rekindle.rules.test.yml" "$dash" \
  "$metrics_doc" "$work/dashboard.rules.yml"
head -1 "$work/out"
if [[ -s "$work/dashboard.rules.yml" ]]; then
  check "every dashboard query parses as PromQL" promtool check rules "$work/dashboard.rules.yml"
else
  bad "dashboard queries were not extracted"
fi

it_finish
