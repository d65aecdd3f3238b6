#!/usr/bin/env bash
# rk report's limits (docs/report.md, "Limits"), through the CLI, each run under a timeout and
# an address-space limit: (1) one line whose numbers sit where doubles are sparse (a loss of
# -1e17 in steps.jsonl, two steps near 2^52 in loss.log, and the other extremes the readers
# accept) still gives a page, at once: every axis counts its ticks; (2) run directories at the
# input bounds (every file as large as it may be, with the records that cost the most: long
# strings that escape to the most bytes, 256-device launches, as many devices as allowed, a
# loss line broken at every step; loss.log of 67 million lines; events.jsonl of 3.5 million
# incidents) are reported within the memory bound and give a page within the page bound that
# says what it left out; (3) a file over a limit (bytes, gate records, device ids, a line
# longer than the reader's piece) is exit 2 with a message and no page; (4) device ids holding control characters (ESC, BEL, CSI) reach
# the page cleaned. Needs python3 only (no data, no browser).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_report_limits
MEM=$((256 << 20))  # RK_REPORT_MAX_MEMORY: rk report's peak resident memory
PAGE=$((16 << 20))  # RK_REPORT_MAX_PAGE: the page's bytes

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

# --- (2) at the input bounds: memory and page within theirs --------------------------------
gen() {  # gen KIND DIR: a run directory at the input bounds
  mkdir -p "$2"
  python3 - "$1" "$2" <<'PY'
import json, sys
kind, d = sys.argv[1], sys.argv[2]
MiB = 1 << 20
J = lambda o: json.dumps(o, separators=(",", ":")) + "\n"
def fill(path, limit, lines):  # lines while the file stays within limit bytes
    n, buf, size = 0, [], 0
    with open(path, "w") as f:
        for l in lines:
            if n + size + len(l) > limit:
                break
            buf.append(l)
            size += len(l)
            if size > MiB:
                f.write("".join(buf))
                n, buf, size = n + size, [], 0
        f.write("".join(buf))
def ugly(k, n):  # n bytes that escape to the most in HTML (&quot;), distinct for each k
    return '"' * (n - len(str(k))) + str(k)
if kind == "bounds":
    def events():  # incidents and injections with every string at its longest
        i = 0
        while True:
            i += 1
            yield J({"t": i * 0.01, "kind": "inject" if i % 2 else ugly(i, 63), "time": ugly(i, 39),
                     "rank": i % 65536, "device": ugly(i, 63), "action": ugly(i, 31), "lost_steps": i,
                     "step": (i * 7919) % (1 << 53), "recovery_s": 1.5, "detail": ugly(i, 1023)})
    fill(f"{d}/events.jsonl", 64 * MiB, events())
    pool = [ugly(k, 63) for k in range(1000)]
    def steps():  # more steps and checkpoints than are kept, a loss line broken at every
        i = 0     # step (launches alternate, a third of the losses null), 256-device launches
        while True:
            i += 1
            t = i * 0.001
            if i <= 420000:
                yield J({"type": "step", "t": t, "launch": i % 2, "rank": 0, "step": i,
                         "loss": None if i % 3 == 0 else (i % 1000) * 1e297 * (-1) ** i, "dt": 0.1})
                yield J({"type": "ckpt", "t": t, "launch": i % 2, "rank": 0, "step": i, "seconds": 0.5})
            if i % 100 == 0 or i > 420000:
                yield J({"type": "launch", "t": t, "launch": i % 1000001,
                         "devices": [pool[(i + r) % 1000] for r in range(256)]})
    fill(f"{d}/steps.jsonl", 256 * MiB, steps())
    def gate():  # as many records as rk run writes, on 3000 more devices (4000 in all)
        for i in range(400256):
            yield J({"type": "gate", "t": 600 + i * 0.001, "device": ugly(1000 + i % 3000, 63),
                     "score": i % 101, "temperature_c": 20 + i % 80, "lost": False,
                     "simulated": True, "threshold": 30})
    fill(f"{d}/gate.jsonl", 256 * MiB, gate())
    json.dump({"outcome": ugly(1, 31), "wall_s": 1e10, "goodput": 0.5}, open(f"{d}/summary.json", "w"))
    json.dump({"model": ugly(2, 63), "test_accuracy": 0.5}, open(f"{d}/metrics.json", "w"))
elif kind == "loss":  # 67 million steps, all step 0: every point its own piece of the line
    with open(f"{d}/loss.log", "wb") as f:
        f.write(b"0 0\n" * (64 * MiB))
elif kind == "events":  # 3.5 million of the smallest incidents
    line = b'{"t":0,"kind":"x"}\n'
    with open(f"{d}/events.jsonl", "wb") as f:
        f.write(line * (64 * MiB // len(line)))
elif kind == "launches":  # the issue's 4 MiB of 256-device launch records
    line = J({"type": "launch", "t": 1, "launch": 0, "devices": [str(i) for i in range(256)]})
    with open(f"{d}/steps.jsonl", "w") as f:
        f.write(line * (4 * MiB // len(line)))
PY
}
for kind in bounds loss events launches; do
  gen $kind "$work/$kind" || { bad "generate $kind"; continue; }
  size=$(du -sb "$work/$kind" | cut -f1)
  rep "$kind" "$work/$kind"
  page=$(stat -c %s "$work/$kind.html" 2>/dev/null || echo 0)
  what="$kind ($((size >> 20)) MiB of input): exit $rc in $sec s, peak $((rss >> 10)) MiB, page $((page >> 10)) KiB"
  if [[ $rc == 0 ]] && ((rss * 1024 <= MEM && page > 0 && page <= PAGE)); then
    ok "$what (bounds: $((MEM >> 20)) MiB, $((PAGE >> 20)) MiB)"
  else
    bad "$what (bounds: $((MEM >> 20)) MiB, $((PAGE >> 20)) MiB; 124: still running): $(head -c 300 "$work/$kind.out")"
  fi
  if [[ $kind != launches ]]; then
    grep -q 'class="warn left-out">Left out of this page' "$work/$kind.html" 2>/dev/null \
      && grep -q "it says what it left out" "$work/$kind.out" \
      && ok "$kind: the page and stderr say what was left out" || bad "$kind: no word of what was left out"
  fi
  rm -rf "${work:?}/$kind"
done
python3 - "$work/bounds.html" "$work/loss.html" "$work/events.html" <<'PY' && ok "the pages draw the capped parts as docs/report.md says" || bad "capped parts"
import re, sys
b, l, e = (open(p).read() for p in sys.argv[1:])
count = lambda t, s: len(re.findall(s, t))
assert count(b, r'<g class="incident-marker') == 500, count(b, r'<g class="incident-marker')
assert count(b, r'class="inject-marker"') == 500
assert count(b, r'class="loss-line"') == 1000 and count(b, r'class="nan-step"') <= 1000
assert count(b, r'<g class="launch-bar"') <= 2048 and count(b, r'class="score-line"') == 256
assert count(b, r'<g class="ckpt-mark"') <= 1001
assert "#251 to #" in b and "more left out" in b  # the tables say where the gap is
assert count(l, r'class="loss-line"') == 1000 and "step records of loss.log" in l
assert count(e, r'<g class="incident-marker') == 500 and "3532045 incidents in events.jsonl" in e
assert 'data-n="3532045"' in e  # the last incident is among those shown
PY

# --- (3) a file over a limit: exit 2, a message, no page ------------------------------------
over() {  # over NAME TEXT: rk report $work/NAME exits 2 with TEXT in its message, no page
  rep "$1" "$work/$1" 120
  if [[ $rc == 2 ]] && grep -qF -- "$2" "$work/$1.out" && [[ ! -e $work/$1.html ]]; then
    ok "$1: exit 2, '$2'"
  else
    bad "$1: exit $rc, $(head -c 300 "$work/$1.out") (want exit 2, '$2', no page)"
  fi
}
mkdir -p "$work/big_events" "$work/big_steps" "$work/big_loss"
truncate -s $(((64 << 20) + 1)) "$work/big_events/events.jsonl"
over big_events "events.jsonl: file is 67108865 bytes, more than the limit of 67108864"
truncate -s $(((256 << 20) + 1)) "$work/big_steps/steps.jsonl"
over big_steps "steps.jsonl: file is 268435457 bytes, more than the limit of 268435456"
truncate -s $(((256 << 20) + 1)) "$work/big_loss/loss.log"
over big_loss "loss.log: file is 268435457 bytes, more than the limit of 268435456"
mkdir -p "$work/many_gate" "$work/many_devs"
python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
g = lambda dev: json.dumps({"type": "gate", "t": 1, "device": dev, "score": 50, "temperature_c": 50,
                            "lost": False, "simulated": True, "threshold": 30}, separators=(",", ":")) + "\n"
open(f"{w}/many_gate/gate.jsonl", "w").write(g("0") * 400257)
open(f"{w}/many_gate/events.jsonl", "w").write('{"t":0,"kind":"crash"}\n')
open(f"{w}/many_devs/gate.jsonl", "w").write("".join(g(str(i)) for i in range(4097)))
open(f"{w}/many_devs/events.jsonl", "w").write('{"t":0,"kind":"crash"}\n')
PY
over many_gate "gate.jsonl line 400257: more than 400256 gate records"
over many_devs "gate.jsonl line 4097: more than 4096 device ids"
# a line of 2 MiB (longer than the 1 MiB piece the reader holds): refused in the middle of the
# file, left out as a cut line at its end
mkdir -p "$work/long_line" "$work/long_last"
launch='{"type":"launch","t":0,"launch":0,"devices":["0"]}'
{ echo "$launch"; head -c $((2 << 20)) /dev/zero | tr '\0' x; echo; echo "$launch"; } >"$work/long_line/steps.jsonl"
over long_line "steps.jsonl line 2: a line longer than 65536 bytes"
{ echo "$launch"; head -c $((2 << 20)) /dev/zero | tr '\0' x; } >"$work/long_last/steps.jsonl"
rep long_last "$work/long_last" 60
[[ $rc == 0 ]] && grep -q "cut line" "$work/long_last.out" && ok "a 2 MiB last line without its newline: left out as a cut line" \
  || bad "a 2 MiB last line: exit $rc: $(head -c 300 "$work/long_last.out")"

# --- (4) device ids with control characters reach the page cleaned --------------------------
mkdir -p "$work/ctl"
python3 - "$work/ctl" <<'PY'
import json, sys
d = sys.argv[1]
ids = ["\x1b[31mred", "bell\x07", "\x9b2J", "\x1b]0;title\x07", "del\x7f"]
with open(f"{d}/steps.jsonl", "w") as f:
    f.write(json.dumps({"type": "launch", "t": 0, "launch": 0, "devices": ids}) + "\n")
    f.write(json.dumps({"type": "step", "t": 1, "launch": 0, "rank": 0, "step": 1, "loss": 1, "dt": 0.1}) + "\n")
with open(f"{d}/gate.jsonl", "w") as f:
    for dev in ids:
        f.write(json.dumps({"type": "gate", "t": 1, "device": dev, "score": 50, "temperature_c": 50,
                            "lost": False, "simulated": True, "threshold": 30}) + "\n")
PY
rep ctl "$work/ctl" 30
python3 - "$work/ctl.html" <<'PY' && ok "device ids from steps.jsonl and gate.jsonl: no control character in the page" \
  || bad "control characters from device ids reached the page"
import re, sys
t = open(sys.argv[1], encoding="utf-8").read()
bad = [hex(ord(c)) for c in t if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f]
assert not bad, bad
assert t.count('<g class="launch-bar"') == 5 and 'data-device="?[31mred"' in t, "ids shown cleaned"
assert t.count('class="score-line"') == 5
PY

it_finish
