#!/usr/bin/env bash
# rk report, on a real run: (1) `rk run` of 2 ranks of `rk train` on 3 simulated GPUs with a
# crash, a NaN, a hang and a flipped parameter bit injected (device 1 fails twice and is
# quarantined; the spare takes its place) writes events, summary, steps, gate readings and
# metrics; (2) `rk report` renders them, and headless Chromium loads the page without a
# console message, finds one incident marker per incident of events.jsonl, a bar per rank of
# each launch, a line per GPU, a mark per checkpoint, and screenshots it at 1280 px (kept as
# BUILD/artefacts/report/report.png); (3) strings from the files are escaped (an event whose
# text holds <script> renders as text, no element); (4) bad input (no directory, a FIFO, a
# broken line, a missing output directory) exits 2 and writes nothing. Skips (77) without
# mpirun, data or chromium.
set -u
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
command -v chromium >/dev/null || { echo "SKIP: chromium not found (scripts/install-deps.sh test)"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_need_data
it_init it_report
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
art=${RK_BUILD:-$RK_TMP/..}/artefacts/report
mkdir -p "$art"

# chrome ARGS... : headless Chromium on this sandbox (root: no sandbox), its own profile
chrome() {
  timeout 120 chromium --headless --no-sandbox --disable-gpu --no-first-run --hide-scrollbars \
    --user-data-dir="$work/chrome" --enable-logging=stderr --v=0 "$@"
}

python3 "$RK_SRC/tests/make_subset.py" "$DATA" "$work/sub" 3200 500 >/dev/null || { bad "make subset"; exit 1; }
run=$work/run
mkdir -p "$run"
spec="crash@step=20:rank=1,nan@step=40:rank=0,hang@step=60:rank=1,bitflip@step=90:rank=0"
"$RK" run -n 2 --devices 0,1,2 --ckpt-dir "$run/ckpt" --heartbeat-timeout 3 --quiet \
  --failure-threshold 2 --health sim --sim-seed 4 --sim-age 2000 --sim-step-time 1m \
  --health-interval 1 --health-threshold 30 --inject "$spec" \
  --events "$run/events.jsonl" --summary-json "$run/summary.json" \
  --steps "$run/steps.jsonl" --gate-log "$run/gate.jsonl" \
  -- "$RK" train --data "$work/sub" --threads 1 --seed 3 --epochs 3 --max-steps 120 \
  --ckpt-every 10 --metrics-json "$run/metrics.json" >"$work/run.out" 2>&1
st=$?
[[ $st == 0 ]] && ok "rk run with 4 injected faults finishes" || bad "rk run: exit $st: $(tail -5 "$work/run.out")"

# --- the records rk run wrote -------------------------------------------------------------
it_count python3 - "$run" <<'PY'
import json, sys
d = sys.argv[1]
def lines(name):
    return [json.loads(l) for l in open(f"{d}/{name}") if l.strip()]
def check(cond, msg):
    print(("ok - " if cond else "FAIL - ") + msg)
st = lines("steps.jsonl")
types = {}
for r in st:
    types.setdefault(r["type"], []).append(r)
steps, launches, ckpts = types.get("step", []), types.get("launch", []), types.get("ckpt", [])
check(len(launches) >= 3, f"steps.jsonl: {len(launches)} launches (crash, hang, rollback or quarantine relaunch)")
check(launches[0]["devices"] == ["0", "1"], f"launch 0 on devices {launches[0]['devices']}")
check(any("2" in l["devices"] for l in launches), "the spare device 2 ran a later launch")
check(max(s["step"] for s in steps) == 120 and all(s["rank"] == 0 for s in steps),
      f"rank 0's steps up to 120 ({len(steps)} records, replays included)")
check(all(k in s for s in steps for k in ("t", "launch", "loss", "dt")), "every step has t, launch, loss, dt")
check(sorted({s["launch"] for s in steps}) == sorted({l["launch"] for l in launches}),
      "every launch that ran has its steps")
check(len(ckpts) >= 10 and all(c["step"] % 10 == 0 for c in ckpts), f"{len(ckpts)} checkpoints, every 10 steps")
ts = [r["t"] for r in st]
check(ts == sorted(ts), "steps.jsonl is in time order")
gate = lines("gate.jsonl")
devs = sorted({g["device"] for g in gate})
check(devs == ["0", "1", "2"] and all(g["simulated"] for g in gate), f"gate.jsonl reads devices {devs} (simulated)")
check(all(0 <= g["score"] <= 100 and g["threshold"] == 30 for g in gate), "scores 0-100, threshold 30")
check(all(g["temperature_c"] is None or 0 < g["temperature_c"] < 150 for g in gate), "temperatures in degrees C")
PY

# --- the report -----------------------------------------------------------------------------
"$RK" report "$run" -o "$work/report.html" >"$work/report.out" 2>&1
st=$?
[[ $st == 0 && -s $work/report.html ]] && ok "rk report writes the page: $(cat "$work/report.out")" \
  || bad "rk report: exit $st: $(cat "$work/report.out")"
"$RK" report --help | grep -q "usage: rk report RUN_DIR" && ok "rk report --help" || bad "--help"

chrome --dump-dom "file://$work/report.html" >"$work/dom.html" 2>"$work/dom.err"
[[ $? == 0 && -s $work/dom.html ]] && ok "chromium loads the page" || bad "chromium --dump-dom: $(tail -3 "$work/dom.err")"
if grep -E ':CONSOLE(:|\()|Uncaught|Refused to' "$work/dom.err"; then bad "console messages while loading the page"
else ok "no console message while loading the page"; fi
chrome --screenshot="$art/report.png" --window-size=1280,3000 "file://$work/report.html" >"$work/shot.out" 2>&1
cp "$work/report.html" "$art/report.html"

# the page as the browser parsed it, against the files it came from
it_count python3 - "$run" "$work/dom.html" "$work/report.html" "$art/report.png" <<'PY'
import json, struct, sys
from html.parser import HTMLParser
d, dom, page, png = sys.argv[1:5]
def check(cond, msg):
    print(("ok - " if cond else "FAIL - ") + msg)
class P(HTMLParser):
    def __init__(s):
        super().__init__(); s.els = []
    def handle_starttag(s, tag, attrs):
        s.els.append((tag, dict(attrs)))
p = P(); p.feed(open(dom).read())
def cls(c):
    return [a for t, a in p.els if c in (a.get("class") or "").split()]
ev = [json.loads(l) for l in open(f"{d}/events.jsonl") if l.strip()]
# incidents: not the injections, not the snapshot notes (docs/run.md, "Accounting")
inc = [e for e in ev if e["kind"] != "inject" and e["kind"] not in ("snapshot_on", "snapshot_held", "snapshot_peak")]
marks = cls("incident-marker")
check(len(marks) == len(inc) > 0, f"{len(marks)} incident markers for the {len(inc)} incidents of events.jsonl")
check([m["data-kind"] for m in marks] == [e["kind"] for e in inc], "each marker has its incident's kind, in order")
kinds = {e["kind"] for e in inc}
for k in ("crash", "hang", "nan", "replica_mismatch", "quarantine"):
    check(k in kinds, f"the run has a {k} incident, marked")
check(len(cls("inject-marker")) == sum(e["kind"] == "inject" for e in ev) == 4, "4 injection marks")
rows = [a for t, a in p.els if t == "tr" and (a.get("class") or "").startswith("fam-")]
check(len(rows) == len(inc) + sum(e["kind"] == "inject" for e in ev), f"{len(rows)} table rows: incidents and injections")
st = [json.loads(l) for l in open(f"{d}/steps.jsonl")]
launches = [r for r in st if r["type"] == "launch"]
bars = cls("launch-bar")
check(len(bars) == sum(len(l["devices"]) for l in launches), f"{len(bars)} launch bars: one per rank of each launch")
check(all(b["data-device"] == launches[[l["launch"] for l in launches].index(int(b["data-launch"]))]["devices"][int(b["data-rank"])] for b in bars),
      "each bar names its launch's device for its rank")
loss = [a for t, a in p.els if t == "polyline" and "loss-line" in a.get("class", "")]
check(len(loss) >= len({r["launch"] for r in st if r["type"] == "step"}) and all(len(a["points"].split()) >= 2 for a in loss),
      f"{len(loss)} loss lines with points")
gp = [a for t, a in p.els if t == "polyline" and a.get("class") == "goodput-line"]
check(len(gp) == 1 and len(gp[0]["points"].split()) > 10, "a goodput line")
gate = [json.loads(l) for l in open(f"{d}/gate.jsonl")]
ndev = len({g["device"] for g in gate})
check(len([a for t, a in p.els if t == "polyline" and a.get("class") == "score-line"]) == ndev, f"{ndev} score lines")
check(len([a for t, a in p.els if t == "polyline" and a.get("class") == "temp-line"]) == ndev, f"{ndev} temperature lines")
check(len(cls("threshold")) == 1, "the threshold line")
ck = [r for r in st if r["type"] == "ckpt"]
check(len(cls("ckpt-mark")) == len(ck), f"{len(ck)} checkpoint marks")
text = open(page).read()
check("<script" not in text.lower() and "src=" not in text and "href=" not in text and "url(" not in text,
      "no script, nothing fetched (no src, href or url())")
check("@media print" in text, "a print stylesheet")
check("simulated" in text, "the page says the GPUs and faults are simulated")
w, h = struct.unpack(">II", open(png, "rb").read()[16:24])
check(w == 1280 and h > 1000, f"screenshot {w}x{h} at {png}")
PY
[[ $(stat -c %s "$art/report.png" 2>/dev/null || echo 0) -gt 50000 ]] && ok "the PNG holds a picture ($(stat -c %s "$art/report.png") bytes): $art/report.png" \
  || bad "no screenshot: $(tail -3 "$work/shot.out")"

# --- a run of rk train alone: its loss log and metrics ------------------------------------
solo=$work/solo
mkdir -p "$solo"
"$RK" train --data "$work/sub" --threads 1 --seed 3 --max-steps 30 --no-eval \
  --loss-log "$solo/loss.log" --metrics-json "$solo/metrics.json" >"$work/solo.out" 2>&1 \
  || bad "rk train alone: $(tail -3 "$work/solo.out")"
"$RK" report "$solo" >"$work/solo.rep" 2>&1 && grep -q "30 step records" "$work/solo.rep" \
  && python3 - "$solo/report.html" <<'PY' && ok "rk train alone: its loss.log drawn (30 steps), no goodput" || bad "solo report: $(cat "$work/solo.rep")"
import re, sys
t = open(sys.argv[1]).read()
pts = re.findall(r'class="loss-line"[^>]*points="([^"]*)"', t)
assert len(pts) == 1 and len(pts[0].split()) == 30, pts
assert "loss.log has no times" in t
PY

# --- strings from the files are escaped -----------------------------------------------------
inj=$work/inj
mkdir -p "$inj"
cp "$run/steps.jsonl" "$inj/"
python3 - "$inj/events.jsonl" <<'PY'
import json, sys
evil = '<script>alert(1)</script><img src=x onerror="alert(2)">\'"&'
with open(sys.argv[1], "w") as f:
    for i, kind in enumerate(["crash", evil, "inject"]):
        f.write(json.dumps({"time": evil, "t": 1.0 + i, "kind": kind, "rank": 0, "device": evil,
                            "action": evil, "lost_steps": 0, "recovery_s": None, "detail": evil}) + "\n")
PY
"$RK" report "$inj" -o "$work/inj.html" >/dev/null 2>&1 && ok "a run whose events hold markup is reported" || bad "injection run"
grep -qi "<script\|<img" "$work/inj.html" && bad "markup from events.jsonl reached the page" \
  || ok "no <script> or <img> from the files in the page"
grep -q "&lt;script&gt;alert(1)&lt;/script&gt;" "$work/inj.html" && ok "the text is shown escaped" || bad "escaped text missing"
chrome --dump-dom "file://$work/inj.html" >"$work/inj.dom" 2>"$work/inj.err"
python3 - "$work/inj.dom" <<'PY' && ok "the browser finds no script or img element, and 2 markers" || bad "browser DOM of the injection page"
import sys
from html.parser import HTMLParser
tags = []
class P(HTMLParser):
    def handle_starttag(s, tag, attrs):
        tags.append((tag, dict(attrs)))
P().feed(open(sys.argv[1]).read())
assert not [t for t, a in tags if t in ("script", "img")], "script or img element"
assert not [a for t, a in tags for k in a if k.startswith("on")], "an event handler attribute"
m = [a for t, a in tags if "incident-marker" in (a.get("class") or "")]
assert len(m) == 2 and m[1]["data-kind"].startswith("<script>"), m
PY
grep -qE ':CONSOLE(:|\()|Uncaught' "$work/inj.err" && bad "console messages on the injection page" || ok "no console message on the injection page"

# --- bad input: exit 2, a message naming the problem, nothing written --------------------------
echo "keep" >"$work/old.html"
"$RK" report "$work/nosuch" -o "$work/x.html" >"$work/b1.out" 2>&1
[[ $? == 2 ]] && grep -q "nosuch" "$work/b1.out" && [[ ! -e $work/x.html ]] && ok "a missing RUN_DIR: exit 2" || bad "missing dir: $(cat "$work/b1.out")"
"$RK" report "$run/summary.json" >"$work/b2.out" 2>&1
[[ $? == 2 ]] && ok "a file as RUN_DIR: exit 2" || bad "file as dir: $(head -2 "$work/b2.out")"
mkdir -p "$work/empty"
"$RK" report "$work/empty" -o "$work/old.html" >"$work/b3.out" 2>&1
[[ $? == 2 ]] && grep -q "holds none of events.jsonl, steps.jsonl, loss.log" "$work/b3.out" && [[ $(cat "$work/old.html") == keep ]] \
  && ok "an empty RUN_DIR: exit 2, the old page unchanged" || bad "empty dir: $(cat "$work/b3.out")"
fifo=$work/fifo
mkdir -p "$fifo" && mkfifo "$fifo/events.jsonl"
timeout 10 "$RK" report "$fifo" -o "$work/old.html" >"$work/b4.out" 2>&1
[[ $? == 2 ]] && grep -q "not a regular file" "$work/b4.out" && [[ $(cat "$work/old.html") == keep ]] \
  && ok "a FIFO for events.jsonl: exit 2 without blocking, nothing written" || bad "fifo: $(cat "$work/b4.out")"
broken=$work/broken
mkdir -p "$broken" && cp "$run/events.jsonl" "$broken/"
{ head -3 "$run/steps.jsonl"; echo '{"type":"step","t":1,"launch":0,"rank":0,"step":-4,"loss":1,"dt":0.1}'; tail -2 "$run/steps.jsonl"; } >"$broken/steps.jsonl"
"$RK" report "$broken" -o "$work/old.html" >"$work/b5.out" 2>&1
[[ $? == 2 ]] && grep -q 'steps.jsonl line 4: field "step"' "$work/b5.out" && [[ $(cat "$work/old.html") == keep ]] \
  && ok "a bad steps line: exit 2 naming file, line and field" || bad "bad line: $(cat "$work/b5.out")"
torn=$work/torn
mkdir -p "$torn" && cp "$run/events.jsonl" "$torn/"
{ cat "$run/steps.jsonl"; printf '{"type":"step","t":99,"lau'; } >"$torn/steps.jsonl"
"$RK" report "$torn" -o "$work/torn.html" >"$work/b6.out" 2>&1
[[ $? == 0 ]] && grep -q "cut line" "$work/b6.out" && grep -q "cut line" "$work/torn.html" \
  && ok "a torn last line (rk run killed mid-write) is left out and said" || bad "torn: $(cat "$work/b6.out")"
printf '{"t":1,"kind":"crash"}\nnot json\n' >"$broken/events.jsonl"
"$RK" report "$broken" -o "$work/old.html" >"$work/b7.out" 2>&1
[[ $? == 2 ]] && grep -q "events.jsonl line 2: not JSON" "$work/b7.out" && ok "a bad events line: exit 2, named" \
  || bad "bad events: $(cat "$work/b7.out")"
"$RK" report "$run" -o "$work/nodir/r.html" >"$work/b8.out" 2>&1
[[ $? == 2 ]] && ok "an output in a missing directory: exit 2" || bad "missing out dir: $(cat "$work/b8.out")"
"$RK" report >"$work/b9.out" 2>&1
[[ $? == 2 ]] && grep -q "no RUN_DIR" "$work/b9.out" && ok "no RUN_DIR: exit 2" || bad "no arg"

it_finish
