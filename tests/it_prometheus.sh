#!/usr/bin/env bash
# Integration test of `rk exporter` with a real Prometheus server: runs
# `rk exporter --sim 8 --interval 1s` on a free loopback port and `prometheus` with
# deploy/prometheus/prometheus.yml (target rewritten to that port, every interval 1 s, its
# own storage in the test's temp dir), then checks through Prometheus's HTTP API that the
# target is up; that 8 GPUs have a health score, each gpu label 0..7 once, in 0..100; that
# rk_gpu_info says simulated="true" for all 8; that the temperatures Prometheus stored are
# the ones the exporter's own /metrics served; that deploy's alert and recording rules load
# and evaluate without errors; and that every query of the Grafana dashboard runs.
# Needs RK, RK_SRC, RK_TMP. Skips (77) while `rk exporter` does not exist, or without
# prometheus, promtool or python3.
set -u
for tool in prometheus promtool python3; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not found (install prometheus)"; exit 77; }
done
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
prom_src=$RK_SRC/deploy/prometheus
for f in "$prom_src/prometheus.yml" "$prom_src/rekindle.rules.yml" \
         "$RK_SRC/deploy/grafana/rekindle.json"; do
  [[ -f $f ]] || { echo "SKIP: $f not found"; exit 77; }
done
if ! "$RK" exporter --help >/dev/null 2>&1; then
  echo "SKIP: $RK has no exporter command yet ('rk exporter --help' fails)"
  exit 77
fi
it_init it_prometheus

# Python helpers: free loopback ports, the config rewrite, and the API checks.
cat >"$work/it.py" <<'EOF'
import json, re, socket, sys, time, urllib.parse, urllib.request

def get(url, timeout=30):  # generous: a loaded machine answers late, not never
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()

def api(base, path, **params):
    url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
    d = json.loads(get(url))
    if d.get("status") != "success":
        raise RuntimeError("%s: %s" % (url, d.get("error")))
    return d["data"]

def ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    out = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    print(" ".join(map(str, out)))

def config(src, dst, exporter):
    # The shipped config with the target and intervals replaced; each must be found once, so a
    # change to prometheus.yml that defeats the rewrite fails here instead of scraping nothing.
    text = open(src).read()
    for pat, rep in ((r'"127\.0\.0\.1:9258"', '"%s"' % exporter),
                     (r"scrape_interval: \S+", "scrape_interval: 1s"),
                     (r"scrape_timeout: \S+", "scrape_timeout: 1s"),
                     (r"evaluation_interval: \S+", "evaluation_interval: 1s")):
        text, k = re.subn(pat, rep, text)
        if k != 1:
            sys.exit("prometheus.yml: %r found %d times, want once" % (pat, k))
    open(dst, "w").write(text)

def wait_up(base, exporter, seconds):
    # Until Prometheus has scraped the exporter's target successfully.
    end, last = time.time() + seconds, "no answer"
    while time.time() < end:
        try:
            t = api(base, "/api/v1/targets")["activeTargets"]
            mine = [x for x in t if x["labels"].get("instance") == exporter]
            if mine and mine[0]["health"] == "up":
                print("target %s up after its scrape at %s" % (exporter, mine[0]["lastScrape"]))
                return
            last = mine[0]["health"] + " " + mine[0].get("lastError", "") if mine else \
                "target not listed (%d targets)" % len(t)
        except Exception as e:
            last = str(e)
        time.sleep(0.25)
    sys.exit("target %s not up in %ds: %s" % (exporter, seconds, last))

def parse_metrics(text, name):
    # {gpu: value} for one metric of the text exposition format
    out = {}
    for line in text.splitlines():
        m = re.match(r'%s\{([^}]*)\}\s+(\S+)' % re.escape(name), line)
        if m:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(1)))
            out[labels.get("gpu")] = float(m.group(2))
    return out

def checks(base, exporter, dash_path):
    def ok(name): print("ok|" + name)
    def bad(name): print("bad|" + name)
    def vec(q):
        return api(base, "/api/v1/query", query=q)["result"]
    gpus = [str(i) for i in range(8)]

    r = vec("count(rk_gpu_health_score)")
    n = int(float(r[0]["value"][1])) if r else 0
    (ok if n == 8 else bad)("count(rk_gpu_health_score) == 8 (got %d)" % n)

    r = vec("rk_gpu_info")
    sim = sorted(x["metric"].get("gpu", "?") for x in r if x["metric"].get("simulated") == "true")
    notsim = [x["metric"] for x in r if x["metric"].get("simulated") != "true"]
    (ok if sim == gpus and not notsim else bad)(
        'rk_gpu_info has simulated="true" for gpu 0..7 (simulated: %s; not: %s)' % (sim, notsim))

    r = vec("rk_gpu_health_score")
    scores = {x["metric"].get("gpu"): float(x["value"][1]) for x in r}
    good = sorted(scores) == gpus and len(r) == 8 and all(0 <= v <= 100 for v in scores.values())
    (ok if good else bad)("one health score in 0..100 for each gpu 0..7 (%s)" %
                          ", ".join("%s:%g" % kv for kv in sorted(scores.items())))

    # The temperatures Prometheus stored equal what the exporter served. Each /metrics says
    # which collection it shows (rk_exporter_collections_total): /metrics is read here every
    # 0.2 s, each collection's temperatures kept, until Prometheus has stored one of those
    # collections (its scrape of it is the signal: 60 s at most); that scrape must hold the
    # same temperatures, at the same timestamp.
    # A GPU the sim has lost (rk_gpu_up 0) has no temperature; every other one must have one.
    def at(series, ts):  # {gpu: value at timestamp ts} of a range query's result
        return {x["metric"].get("gpu"): float(v) for x in series
                for t, v in x["values"] if t == ts}
    got, ts, c = {}, None, None
    end = time.time() + 60
    while ts is None and time.time() < end:
        text = get("http://%s/metrics" % exporter)
        n = [float(l.split()[1]) for l in text.splitlines()
             if l.startswith("rk_exporter_collections_total ")][0]
        got.setdefault(n, parse_metrics(text, "rk_gpu_temperature_celsius"))
        r = vec('rk_exporter_collections_total{instance="%s"}[60s]' % exporter)
        for t, v in (r[0]["values"] if r else []):
            if float(v) in got:
                ts, c = t, float(v)
        if ts is None:
            time.sleep(0.2)
    served = got.get(c, {})
    stored = at(vec("rk_gpu_temperature_celsius[60s]"), ts) if ts is not None else {}
    answering = sorted(g for g, v in at(vec("rk_gpu_up[60s]"), ts).items() if v == 1) \
        if ts is not None else []
    missing = [g for g in answering if g not in served or served[g] != stored.get(g)]
    detail = ", ".join("%s:%g" % (g, served[g]) for g in sorted(served))
    (ok if ts is not None and answering and not missing and sorted(served) == answering
     and sorted(stored) == answering else bad)(
        "rk_gpu_temperature_celsius in Prometheus equals the exporter's /metrics for each GPU "
        "answering, %s, in collection %s (%s; unmatched: %s; stored: %s)"
        % (answering, c, detail, missing, stored if ts is not None else
           "none of the %d collections read here in 60 s" % len(got)))
    plausible = all(0 <= v <= 120 for v in served.values())
    (ok if plausible else bad)("temperatures within 0..120 C (%s)" % detail)

    # The rules: both groups loaded, every rule evaluated without error. A round of
    # evaluations after the data above was stored is the signal: each rule's lastEvaluation
    # changed from what it was here, and none is "unknown" (not yet evaluated); 30 s at most.
    def rule_list(gs):
        return [r for g in gs for r in g["rules"]]
    before = {r["name"]: r.get("lastEvaluation")
              for r in rule_list(api(base, "/api/v1/rules")["groups"])}
    end = time.time() + 30
    while True:
        groups = api(base, "/api/v1/rules")["groups"]
        fresh = [r for r in rule_list(groups) if r.get("health") != "unknown"
                 and r.get("lastEvaluation") != before.get(r["name"])]
        if (len(groups) == 2 and len(fresh) == len(rule_list(groups))) or time.time() > end:
            break
        time.sleep(0.2)
    print("rules evaluated since the check began: %d of %d" % (len(fresh), len(rule_list(groups))))
    names = sorted(g["name"] for g in groups)
    rules = [r for g in groups for r in g["rules"]]
    alerts = [r for r in rules if r["type"] == "alerting"]
    unhealthy = ["%s: %s %s" % (r["name"], r.get("health"), r.get("lastError", ""))
                 for r in rules if r.get("health") != "ok"]
    (ok if names == ["rekindle.alerts", "rekindle.recording"] and len(alerts) >= 10
     and not unhealthy else bad)(
        "/api/v1/rules: groups %s, %d rules, %d alerts, all evaluated ok (not: %s)"
        % (names, len(rules), len(alerts), unhealthy))
    firing = sorted(set("%s gpu%s" % (a["labels"]["alertname"], a["labels"].get("gpu", "-"))
                        for r in alerts for a in r.get("alerts", [])))
    down = [a for a in firing if a.startswith("RekindleExporterDown")]
    (ok if not down else bad)("RekindleExporterDown is not active for a live exporter")
    print("alerts pending or firing on the simulated fleet: %s" % (firing or "none"))
    r = vec("instance:rk_gpus_up:sum")
    up = [float(x["value"][1]) for x in r]
    (ok if len(up) == 1 and 0 <= up[0] <= 8 else bad)(
        "recording rule instance:rk_gpus_up:sum evaluates (%s)" % up)

    # Every dashboard query runs (variables set to match everything).
    d = json.load(open(dash_path))
    def walk(ps):
        for p in ps:
            yield p
            yield from walk(p.get("panels", []))
    errors, empty, total = [], [], 0
    for p in walk(d["panels"]):
        for t in p.get("targets", []):
            q = t["expr"].replace("$__rate_interval", "5s")
            q = re.sub(r"\$\{?(\w+)\}?", ".*", q)
            total += 1
            try:
                if not vec(q):
                    empty.append(p["title"])
            except Exception as e:
                errors.append("%s: %s" % (p["title"], e))
    (ok if not errors else bad)("all %d dashboard queries run (%s)" % (total, errors))
    print("dashboard queries with no data on this fleet: %d (%s)"
          % (len(empty), ", ".join(sorted(set(empty)))))

if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "ports": ports(int(sys.argv[2]))
    elif cmd == "config": config(*sys.argv[2:5])
    elif cmd == "wait": wait_up(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    elif cmd == "wait-metrics":
        end = time.time() + float(sys.argv[3])
        while True:
            try:
                if "rk_gpu_health_score" in get("http://%s/metrics" % sys.argv[2]): break
            except Exception:
                pass
            if time.time() > end: sys.exit("exporter %s: no /metrics in time" % sys.argv[2])
            time.sleep(0.2)
    elif cmd == "checks": checks(*sys.argv[2:5])
EOF
py() { python3 "$work/it.py" "$@"; }

read -r eport pport < <(py ports 2)
exporter=127.0.0.1:$eport
prom=http://127.0.0.1:$pport

"$RK" exporter --sim 8 --interval 1s --listen "$exporter" >"$work/exporter.log" 2>&1 &
exporter_pid=$!
pids+=("$exporter_pid")
if py wait-metrics "$exporter" 10 2>"$work/err"; then
  ok "rk exporter serves /metrics on $exporter"
else
  bad "rk exporter on $exporter: $(cat "$work/err"); log: $(tail -c 600 "$work/exporter.log")"
  it_finish; exit
fi

mkdir -p "$work/prom"
cp "$prom_src/rekindle.rules.yml" "$work/prom/"
if ! py config "$prom_src/prometheus.yml" "$work/prom/prometheus.yml" "$exporter" 2>"$work/err"
then
  bad "rewrite prometheus.yml: $(cat "$work/err")"; it_finish; exit
fi
prometheus --config.file="$work/prom/prometheus.yml" --storage.tsdb.path="$work/prom/data" \
  --web.listen-address="127.0.0.1:$pport" --log.level=warn >"$work/prometheus.log" 2>&1 &
prom_pid=$!
pids+=("$prom_pid")
if py wait "$prom" "$exporter" 20 >"$work/out" 2>&1; then
  ok "prometheus scrapes the exporter ($(cat "$work/out"))"
else
  bad "prometheus: $(cat "$work/out"); log: $(tail -c 800 "$work/prometheus.log")"
  it_finish; exit
fi

py checks "$prom" "$exporter" "$RK_SRC/deploy/grafana/rekindle.json" >"$work/out" 2>&1
while IFS= read -r line; do
  case $line in
    ok\|*) ok "${line#ok|}" ;;
    bad\|*) bad "${line#bad|}" ;;
    *) echo "$line" ;;
  esac
done <"$work/out"
grep -q '^ok|all [0-9]* dashboard queries run' "$work/out" || bad "the API checks did not finish"

# Stop both by pid: each must exit on SIGTERM within 5 s.
for name in prometheus exporter; do
  [[ $name == prometheus ]] && pid=$prom_pid || pid=$exporter_pid
  if ! kill -0 "$pid" 2>/dev/null; then
    bad "$name (pid $pid) died during the test; log: $(tail -c 600 "$work/$name.log")"
    continue
  fi
  kill -TERM "$pid"
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then bad "$name (pid $pid) still runs 5 s after SIGTERM"
  else ok "$name stops on SIGTERM"; fi
done

it_finish
