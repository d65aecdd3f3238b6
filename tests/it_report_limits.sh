#!/usr/bin/env bash
# rk report's axes (docs/report.md, "Limits"), through the CLI, each run under a deadline and
# an address-space limit: one line whose numbers sit where doubles are sparse (a loss of
# -1e17 in steps.jsonl, two steps near 2^52 in loss.log, and the other extremes the readers
# accept) still gives a page, at once, with distinct ticks: every axis counts its ticks.
# Needs python3 only (no data, no browser).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_report_limits

# rep NAME DIR [LIMIT_S]: `rk report DIR -o $work/NAME.html` with a deadline (default 300 s)
# and an address space of 1 GiB (so a report that grows without bound fails here instead of
# taking the machine); sets $rc (124: the deadline passed), $rss (peak resident KiB) and $sec,
# and leaves stdout and stderr in $work/NAME.out
rep() {
  read -r rc rss sec < <(python3 - "${3:-300}" "$work/$1.out" "$RK" report "$2" -o "$work/$1.html" <<'PY'
import resource, subprocess, sys, time
limit, out, argv = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
def cap():
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
t0 = time.monotonic()
with open(out, "w") as f:
    p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, preexec_fn=cap)
    try:
        rc = p.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        rc = 124
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, round(time.monotonic() - t0, 2))
PY
  )
}

# --- (1) numbers where doubles are sparse: every axis ends --------------------------------
step='{"type":"step","t":%s,"launch":0,"rank":0,"step":%s,"loss":%s,"dt":0.1}\n'
n=0
for line in "1 1 -1e17" "1 1 1e17" "1 1 -1e300" "1 1 1e300" "1 1 1e-300" "1 9007199254740992 1" \
            "1e10 1 1" "0 1 0"; do
  n=$((n + 1))
  mkdir -p "$work/one$n"
  # shellcheck disable=SC2086
  printf "$step" $line >"$work/one$n/steps.jsonl"
  rep "one$n" "$work/one$n" 30
  [[ $rc == 0 && -s $work/one$n.html ]] && ok "steps.jsonl of one step (t, step, loss: $line): a page in ${sec} s" \
    || bad "steps.jsonl of one step ($line): exit $rc (124: still drawing after 30 s): $(head -c 300 "$work/one$n.out")"
done
mkdir -p "$work/two"
printf '{"type":"step","t":1,"launch":0,"rank":0,"step":1,"loss":-1e300,"dt":0.1}\n{"type":"step","t":2,"launch":0,"rank":0,"step":2,"loss":1e300,"dt":0.1}\n' >"$work/two/steps.jsonl"
rep two "$work/two" 30
[[ $rc == 0 ]] && ok "losses of -1e300 and 1e300 on one axis: a page" || bad "-1e300..1e300: exit $rc"
for steps in "4503599627370495 4503599627370496" "9007199254740990 9007199254740991" "0 9007199254740991"; do
  mkdir -p "$work/ll"
  printf '%s 1\n%s 2\n' $steps >"$work/ll/loss.log"
  rep ll "$work/ll" 30
  [[ $rc == 0 && -s $work/ll.html ]] && ok "loss.log with steps $steps: a page in ${sec} s" \
    || bad "loss.log with steps $steps: exit $rc (124: still drawing after 30 s): $(head -c 300 "$work/ll.out")"
done
python3 - "$work/ll.html" "$work/one1.html" <<'PY' && ok "their ticks are distinct numbers" || bad "ticks repeat"
import re, sys
for page in sys.argv[1:]:
    for svg in re.findall(r"<svg.*?</svg>", open(page).read(), re.S):
        ticks = re.findall(r'class="tick"[^>]*text-anchor="(end|middle)">([^<]*)<', svg)
        for axis in ("end", "middle"):
            labels = [v for a, v in ticks if a == axis]
            assert len(labels) == len(set(labels)) and len(labels) <= 50, (page, labels)
PY
mkdir -p "$work/gx"
python3 - "$work/gx" <<'PY'
import json, sys
d = sys.argv[1]
with open(f"{d}/gate.jsonl", "w") as f:
    for t, temp in ((1e10, -100), (1e10, 300), (0, 300)):
        f.write(json.dumps({"type": "gate", "t": t, "device": "0", "score": 100, "temperature_c": temp,
                            "lost": False, "simulated": True, "threshold": 100}) + "\n")
with open(f"{d}/steps.jsonl", "w") as f:
    f.write(json.dumps({"type": "ckpt", "t": 1e10, "launch": 0, "rank": 0, "step": 2 ** 53, "seconds": 1e9}) + "\n")
    f.write(json.dumps({"type": "launch", "t": 1e10, "launch": 1000000, "devices": ["0"]}) + "\n")
with open(f"{d}/events.jsonl", "w") as f:
    f.write(json.dumps({"t": 1e10, "kind": "crash", "step": 2 ** 53, "recovery_s": 1e10}) + "\n")
PY
rep gx "$work/gx" 30
[[ $rc == 0 ]] && ok "gate, checkpoint, launch and event at their largest times, temperatures, steps: a page" \
  || bad "extreme gate/ckpt/launch/event: exit $rc: $(head -c 300 "$work/gx.out")"

it_finish
