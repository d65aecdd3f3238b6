#!/usr/bin/env bash
# rk exporter keeps answering scrapes while clients misbehave (docs/exporter.md, "Limits"),
# everything on 127.0.0.1, against `rk exporter --sim 16` on a free port:
#   (1) the cap per client: 300 idle connections from one address leave at most 128 open
#       (and not many fewer), and a scrape from that same address answers;
#   (2) the total deadline: a request trickled a byte every 0.3 s (never idle long enough for
#       an inactivity timeout) is closed, not before the 10 s deadline, not left open;
#   (3) while tests/slowclient.py holds 500 idle and 130 trickling connections from
#       127.0.0.1 (reopening each one the server closes, bounded in count and time), 20
#       scrapes with curl each answer 200 within 1 s, and a kept-alive connection asking every
#       0.5 s keeps being served on the same connection; no trickled request is ever answered
#       200; the exporter is still up and serving afterwards, and exits 0 on SIGTERM.
# Skips (77) without python3 or curl.
set -u
for tool in python3 curl; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not found"; exit 77; }
done
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_exporter_slow
slowclient=$RK_SRC/tests/slowclient.py

"$RK" exporter --sim 16 --listen 127.0.0.1:0 >"$work/x.out" 2>"$work/x.err" &
pid=$!
pids+=("$pid")
addr=
for _ in $(seq 1 100); do
  addr=$(sed -n 's|.*serving http://\([^/]*\)/metrics.*|\1|p' "$work/x.out")
  [[ -n $addr ]] && break
  sleep 0.1
done
if [[ -z $addr ]]; then
  bad "rk exporter --sim 16 did not start: $(cat "$work/x.out" "$work/x.err")"
  it_finish
  exit
fi
ok "rk exporter --sim 16 listens on $addr"

# checks.py STEP: one group of checks against the exporter; its ok/FAIL lines count here
cat >"$work/checks.py" <<'EOF'
import select, socket, sys, time, http.client

host, port = sys.argv[2].rsplit(":", 1)
port = int(port)
fails = 0

def check(cond, msg):
    global fails
    print(("ok - " if cond else "FAIL - ") + msg)
    fails += 0 if cond else 1

def closed(s):
    # has the server closed it? (no data is ever sent to these)
    r, _, _ = select.select([s], [], [], 0)
    if not r:
        return False
    try:
        return s.recv(4096) == b""
    except OSError:
        return True

def scrape():
    c = http.client.HTTPConnection(host, port, timeout=5)
    c.request("GET", "/metrics")
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, body

def cap():
    socks = [socket.create_connection((host, port), timeout=5) for _ in range(300)]
    # Idle connections reach the server after about 1 s (TCP_DEFER_ACCEPT); it closes those
    # over the cap as they come: wait until it has closed 172 (30 s at most), then look.
    gone = set()
    end = time.time() + 30
    while True:
        gone |= {i for i, s in enumerate(socks) if i not in gone and closed(s)}
        if len(socks) - len(gone) <= 128 or time.time() > end:
            break
        time.sleep(0.1)
    still = len(socks) - len(gone)
    check(100 <= still <= 128,
          "300 idle connections from one address: %d still open (cap 128; only those over it closed)"
          % still)
    st, body = scrape()
    check(st == 200 and b"rk_gpu_info{" in body, "a scrape from the same address meanwhile: %d" % st)
    for s in socks:
        s.close()

def deadline():
    s = socket.create_connection((host, port), timeout=5)
    req = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
    t0 = time.monotonic()
    gone = None
    for b in req:
        try:
            s.send(bytes([b]))
        except OSError:
            gone = time.monotonic() - t0
            break
        r, _, _ = select.select([s], [], [], 0.3)
        if r:
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if not data or data.startswith(b"HTTP/"):
                gone = time.monotonic() - t0
                break
        if time.monotonic() - t0 > 60:
            break
    s.close()
    # closed, and not before the deadline (a loaded machine can only make it later; 60 s at
    # most, the request would take 300 s to trickle in)
    check(gone is not None and gone >= 9,
          "a request trickled a byte every 0.3 s is closed by the 10 s deadline: %s"
          % ("after %.1f s" % gone if gone is not None else "still open after 60 s"))

def keepalive():
    # one kept-alive connection asking every 0.5 s while the attack runs
    c = http.client.HTTPConnection(host, port, timeout=5)
    sts, socks = [], set()
    for _ in range(8):
        try:
            c.request("GET", "/metrics")
            r = c.getresponse()
            r.read()
            sts.append(r.status)
            socks.add(id(c.sock))
        except (OSError, http.client.HTTPException) as e:
            sts.append(type(e).__name__)
            c.close()
        time.sleep(0.5)
    c.close()
    check(sts == [200] * 8 and len(socks) == 1,
          "a kept-alive connection asking every 0.5 s during the attack: %s on %d connection(s)"
          % (sts, len(socks)))

globals()[sys.argv[1]]()
sys.exit(1 if fails else 0)
EOF
run_py() { it_count python3 "$work/checks.py" "$1" "$addr"; }

# --- (1) the cap per client, (2) the total deadline ----------------------------------------
run_py cap
run_py deadline

# --- (3) 500 idle + 130 trickling connections, and curl scrapes -----------------------------
# The attack runs until the checks below are done (SIGTERM: it stops and still writes its
# stats); --seconds is only a bound, below ctest's 1500 s. A fixed 25 s ran out first on a
# loaded machine, and 180 s at a load of 28 on 2 cores (the scrapes and checks took longer).
python3 "$slowclient" "$addr" --idle 500 --trickle 130 --every 0.2 --seconds 1200 \
  --max-connects 2000000 --ready "$work/ready" >"$work/attack.json" 2>"$work/attack.err" &
attack=$!
pids+=("$attack")
for _ in $(seq 1 150); do
  [[ -e $work/ready ]] && break
  sleep 0.1
done
if [[ -e $work/ready ]]; then ok "the attack holds its 630 slots (each connected at least once)"
else bad "the attack did not get all 630 slots connected in 15 s"; fi
slow=0 failed=0 worst=0
for i in $(seq 1 20); do
  r=$(curl -s -o "$work/scrape.txt" -w '%{http_code} %{time_total}' --max-time 5 "http://$addr/metrics")
  code=${r%% *} t=${r#* }
  if [[ $code != 200 ]] || ! grep -q '^rk_gpu_info{' "$work/scrape.txt"; then
    failed=$((failed + 1))
  elif python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 1.0 else 1)" "$t"; then :
  else slow=$((slow + 1)); fi
  worst=$(python3 -c "import sys; print(max(float(sys.argv[1]), float(sys.argv[2])))" "$worst" "${t:-5}")
  echo "# scrape $i under attack: $code in ${t}s"
  sleep 0.25
done
if [[ $failed -eq 0 && $slow -eq 0 ]]; then ok "20 curl scrapes during the attack: all 200 within 1 s (slowest ${worst}s)"
else bad "20 curl scrapes during the attack: $failed failed, $slow over 1 s (slowest ${worst}s)"; fi
run_py keepalive
kill -0 "$attack" 2>/dev/null && ok "the attack was still running after the scrapes" \
  || bad "the attack ended before the scrapes did: $(cat "$work/attack.json" "$work/attack.err")"
kill -TERM "$attack" 2>/dev/null
wait "$attack"
echo "# attack: $(cat "$work/attack.json")"
python3 - "$work/attack.json" <<'EOF' && ok "attack stats: 630+ connects, none answered 200" || bad "attack stats: $(cat "$work/attack.json")"
import json, sys
s = json.load(open(sys.argv[1]))
sys.exit(0 if s["connects"] >= 630 and s["ok_responses"] == 0 else 1)
EOF

code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://$addr/metrics")
[[ $code == 200 ]] && ok "serving after the attack" || bad "after the attack: $code"
kill -TERM "$pid"
for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then bad "still running 5 s after SIGTERM"
else wait "$pid"; rc=$?; [[ $rc -eq 0 ]] && ok "SIGTERM: exit 0" || bad "SIGTERM: exit $rc"; fi
it_finish
