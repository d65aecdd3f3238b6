#!/usr/bin/env bash
# rk exporter over real HTTP: (1) bad flags exit 2 naming the problem; no NVML and no --sim
# exits 1 with one line; a port in use exits 1 naming it; (2) `rk exporter --sim 8 --interval
# 1s` on a free loopback port prints its address and that its GPUs are simulated, serves
# /metrics that `promtool check metrics` finds nothing wrong with, with the exact Content-Type,
# 8 simulated GPUs and collections that advance every interval; /healthz says ok; / links
# /metrics; 404, 405 (with Allow), 413 (a request body), 414 (a path over 1 KiB); HEAD has
# GET's headers and no body; query strings are ignored; keep-alive works; 64 concurrent
# scrapes all succeed; (3) raw-socket garbage, bad request lines, huge headers and a
# slowloris half request (closed by the server's timeout) leave it serving; (4) a malformed
# textfile makes /healthz 503 with the reason and counts collection errors, and mending it
# brings ok back; a good textfile's VRM ripple shows up in volts; (5) SIGTERM and SIGINT end
# it with status 0 within 5 s. Skips (77) without promtool or python3.
set -u
for tool in promtool python3; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not found (install prometheus, python3)"; exit 77; }
done
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_exporter

# stop PID SIGNAL: send it and wait up to 5 s; sets $stopped to "STATUS SECONDS" or "running"
stop() {
  local p=$1 sig=$2 t0 rc
  t0=$(date +%s%N)
  kill "-$sig" "$p"
  for _ in $(seq 1 50); do
    kill -0 "$p" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$p" 2>/dev/null; then stopped=running; return; fi
  wait "$p"
  rc=$?
  stopped="$rc $(( ($(date +%s%N) - t0) / 1000000 )) ms"
}

# --- (1) usage and start-up failures ------------------------------------------------------
usage_case() {
  local want=$1; shift
  "$RK" exporter "$@" >"$work/u.out" 2>"$work/u.err"
  local rc=$?
  if [[ $rc -eq 2 ]] && grep -q -- "$want" "$work/u.err"; then ok "exporter $* -> exit 2 naming '$want'"
  else bad "exporter $* -> exit $rc: $(head -2 "$work/u.err")"; fi
}
usage_case "--interval" --sim 2 --interval 5x
usage_case "--interval" --sim 2 --interval 10ms
usage_case "--interval" --sim 2 --interval -1s
usage_case "--sim" --sim 0
usage_case "--sim" --sim 2.5
usage_case "--seed, --age, --time-scale, --sim-load and --sim-sensors need --sim" --seed 3
usage_case "need --sim" --sim-sensors
usage_case "--sim-load 'hot' is not idle or busy" --sim 2 --sim-load hot
usage_case "--time-scale" --sim 2 --time-scale 0
usage_case "--threshold" --sim 2 --threshold 101
usage_case "listen address" --sim 2 --listen 127.0.0.1
usage_case "listen address" --sim 2 --listen 127.0.0.1:99999
usage_case "listen address" --sim 2 --listen example.org:9258
usage_case "no address" --sim 2 --listen :9258
usage_case "unknown option" --sim 2 --bogus
usage_case "unexpected argument" --sim 2 extra
if "$RK" exporter --help | grep -q "127.0.0.1:9258"; then ok "--help names the default listen address"
else bad "--help: $("$RK" exporter --help 2>&1 | head -3)"; fi

if ldconfig -p 2>/dev/null | grep -q "libnvidia-ml.so.1"; then
  echo "# NVML is installed here: the no-NVML start-up check does not apply"
else
  "$RK" exporter --listen 127.0.0.1:0 >"$work/nonvml.out" 2>"$work/nonvml.err"
  rc=$?
  if [[ $rc -eq 1 && $(wc -l <"$work/nonvml.err") -eq 1 ]] && grep -q -- "--sim" "$work/nonvml.err"; then
    ok "no NVML and no --sim: exit 1, one line ($(cat "$work/nonvml.err"))"
  else bad "no NVML: exit $rc: $(cat "$work/nonvml.err")"; fi
fi

# --- (2) a simulated fleet of 8 -------------------------------------------------------------
if start main --sim 8 --interval 1s --listen 127.0.0.1:0; then
  ok "rk exporter --sim 8 listens on $addr"
else
  bad "rk exporter did not start: $(cat "$work/main.out" "$work/main.err")"
  it_finish; exit
fi
main_pid=$pid main_addr=$addr
grep -q "8 simulated GPUs" "$work/main.out" && ok "start line says the GPUs are simulated" \
  || bad "start line: $(cat "$work/main.out")"

# the same port again: exit 1 naming the address
"$RK" exporter --sim 1 --listen "$main_addr" >"$work/dup.out" 2>"$work/dup.err"
rc=$?
if [[ $rc -eq 1 ]] && grep -q "in use" "$work/dup.err"; then ok "a port in use: exit 1 ($(cat "$work/dup.err"))"
else bad "port in use: exit $rc: $(cat "$work/dup.err")"; fi

cat >"$work/checks.py" <<'EOF'
import concurrent.futures, http.client, re, socket, sys, time

host, port = sys.argv[2].rsplit(":", 1)
port = int(port)
fails = 0

def check(cond, msg):
    global fails
    print(("ok - " if cond else "FAIL - ") + msg)
    fails += 0 if cond else 1

def req(method, path, body=None, headers=None, conn=None):
    c = conn or http.client.HTTPConnection(host, port, timeout=10)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    if not conn:
        c.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, data

def raw(data, timeout=5.0):
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except (socket.timeout, ConnectionResetError, BrokenPipeError):
        pass
    finally:
        s.close()
    return out

def metric(text, name):
    vals = [float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
            if l.startswith(name + " ") or l.startswith(name + "{")]
    return vals

def basics(out):
    st, h, body = req("GET", "/metrics")
    check(st == 200, "GET /metrics: %d" % st)
    check(h.get("content-type") == "text/plain; version=0.0.4; charset=utf-8",
          "Content-Type %r" % h.get("content-type"))
    open(out, "wb").write(body)
    text = body.decode()
    info = [l for l in text.splitlines() if l.startswith("rk_gpu_info{")]
    check(len(info) == 8 and all('simulated="true"' in l for l in info),
          "8 rk_gpu_info series, all simulated=\"true\"")
    check(sorted(int(re.search(r'gpu="(\d+)"', l).group(1)) for l in info) == list(range(8)),
          "gpu labels 0..7")
    check(metric(text, "rk_exporter_gpus") == [8.0], "rk_exporter_gpus 8")
    scores = metric(text, "rk_gpu_health_score")
    check(len(scores) == 8 and all(0 <= s <= 100 for s in scores), "8 scores in 0..100")
    c0 = metric(text, "rk_exporter_collections_total")[0]
    ts0 = metric(text, "rk_exporter_last_collection_timestamp_seconds")[0]
    # Unix time in seconds (not milliseconds, not a monotonic clock): within a minute of ours
    check(abs(ts0 - time.time()) < 60, "last collection %.1f s ago" % (time.time() - ts0))
    # The collections advance: two more (30 s at most). And never faster than the 1 s
    # interval, by the exporter's own clock: a collection is never scheduled less than an
    # interval after the one before it was, nor before that one ended, so the collections
    # after c0 up to c1 ended within (ts0, ts1] only if ts1 - ts0 >= (c1 - c0 - 1) * 1 s.
    end = time.time() + 30
    while True:
        text = req("GET", "/metrics")[2].decode()
        c1 = metric(text, "rk_exporter_collections_total")[0]
        ts1 = metric(text, "rk_exporter_last_collection_timestamp_seconds")[0]
        if c1 - c0 >= 2 or time.time() > end:
            break
        time.sleep(0.1)
    check(c1 - c0 >= 2 and ts1 - ts0 >= (c1 - c0 - 1) * 1.0 - 0.01,
          "collections advance, at most one per 1 s interval: %d -> %d, the last %.2f s after "
          "the first" % (c0, c1, ts1 - ts0))

    st, h, body = req("GET", "/healthz")
    check(st == 200 and body == b"ok\n", "/healthz: %d %r" % (st, body[:80]))
    st, h, body = req("GET", "/")
    check(st == 200 and b'href="/metrics"' in body and h.get("content-type", "").startswith("text/html"),
          "/ is an HTML page linking /metrics")
    st, h, body = req("GET", "/nope")
    check(st == 404, "GET /nope: %d" % st)
    st, h, body = req("GET", "/metrics/extra")
    check(st == 404, "GET /metrics/extra: %d" % st)
    for m in ("POST", "PUT", "DELETE", "OPTIONS", "PATCH"):
        st, h, body = req(m, "/metrics")
        check(st == 405 and h.get("allow") == "GET, HEAD", "%s /metrics: %d, Allow %r" % (m, st, h.get("allow")))
    st, h, body = req("GET", "/metrics", body=b"x=1", headers={"Content-Type": "text/plain"})
    check(st == 413, "GET with a body: %d" % st)
    st, h, body = req("GET", "/" + "a" * 1100)
    check(st == 414, "a 1101-byte path: %d" % st)
    st, h, body = req("GET", "/" + "a" * 1023)
    check(st == 404, "a 1024-byte path: %d (not 414)" % st)
    gst, gh, gbody = req("GET", "/metrics")
    st, h, body = req("HEAD", "/metrics")
    check(st == 200 and body == b"" and h.get("content-type") == gh.get("content-type")
          and int(h.get("content-length", -1)) > 1000, "HEAD /metrics: headers, no body")
    st, h, body = req("HEAD", "/healthz")
    check(st == 200 and body == b"", "HEAD /healthz: %d" % st)
    st, h, body = req("GET", "/metrics?name[]=x&debug=1")
    check(st == 200 and b"rk_gpu_info{" in body, "a query string is ignored: %d" % st)
    c = http.client.HTTPConnection(host, port, timeout=10)
    sts = [req("GET", p, conn=c)[0] for p in ("/metrics", "/healthz", "/metrics")]
    c.close()
    check(sts == [200, 200, 200], "three requests on one kept-alive connection: %s" % sts)
    with concurrent.futures.ThreadPoolExecutor(64) as ex:
        res = list(ex.map(lambda _: req("GET", "/metrics")[0], range(256)))
    check(res.count(200) == 256, "256 scrapes over 64 concurrent connections: %d ok" % res.count(200))

def garbage(out):
    # a half request that never ends: the server must close it (connection timeout)
    slow = socket.create_connection((host, port), timeout=30)
    slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    t0 = time.time()
    cases = [
        (b"\x00\xff\xfe garbage\r\n\r\n", "binary garbage"),
        (b"GET\r\n\r\n", "a request line without a path"),
        (b"GET /metrics\r\n\r\n", "HTTP/0.9 style"),
        (b"GET /metrics HTTP/9.9\r\nHost: x\r\n\r\n", "HTTP/9.9"),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100000 + b"\r\n\r\n", "a 100 KB header"),
        (b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(5000)) + b"\r\n", "5000 headers"),
        (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", "a 70 KB path"),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "a chunked body"),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n", "an absurd Content-Length"),
        (b"GET /%00%ff/../metrics HTTP/1.1\r\nHost: x\r\n\r\n", "escapes in the path"),
        (b"\r\n" * 1000, "blank lines"),
    ]
    for data, what in cases:
        r = raw(data)
        status = r.split(b"\r\n", 1)[0].decode("latin-1")[:40]
        st, h, body = req("GET", "/metrics")
        check(st == 200, "%s (answered %r): still serving" % (what, status or "nothing"))
    try:
        got = slow.recv(100)
        closed = time.time() - t0
        check(got == b"" or got.startswith(b"HTTP/1.1 4"),
              "slowloris half request closed by the server after %.1f s" % closed)
    except socket.timeout:
        check(False, "slowloris half request still open after 30 s")
    slow.close()
    st, h, body = req("GET", "/metrics")
    open(out, "wb").write(body)
    check(st == 200, "serving after the garbage")

def healthz_until(want, seconds=30):
    """/healthz until it answers `want` (at most `seconds`): the last answer."""
    end = time.time() + seconds
    while True:
        st, h, body = req("GET", "/healthz")
        if st == want or time.time() > end:
            return st, h, body
        time.sleep(0.1)

def unhealthy(out):
    # 503 once no collection has succeeded for 3 intervals
    st, h, body = healthz_until(503)
    open(out, "wb").write(req("GET", "/metrics")[2])
    print("# /healthz said: %d %r" % (st, body))
    check(st == 503 and b"bad.prom" in body, "/healthz 503 naming the malformed textfile")
    text = req("GET", "/metrics")[2].decode()
    check(metric(text, "rk_exporter_collection_errors_total")[0] >= 1, "collection errors counted")

def healthy(out):
    # until a collection has read the good file (one between the removal of the bad file and
    # the good one's arrival is healthy too, without the ripple): at most 30 s
    end = time.time() + 30
    while True:
        st, h, hbody = req("GET", "/healthz")
        body = req("GET", "/metrics")[2]
        v = [l for l in body.decode().splitlines() if l.startswith('rk_gpu_vrm_ripple_volts{gpu="0"')]
        if (st == 200 and v) or time.time() > end:
            break
        time.sleep(0.1)
    check(st == 200 and hbody == b"ok\n", "/healthz ok again once the textfile is mended: %d %r" % (st, hbody[:100]))
    open(out, "wb").write(body)
    check(len(v) == 1 and abs(float(v[0].rsplit(" ", 1)[1]) - 0.0555) < 1e-12,
          "a textfile's 0.0555 V ripple (rk_sensor_vrm_ripple_volts) is served as 0.0555 V: %s" % v)

globals()[sys.argv[1]](sys.argv[3])
sys.exit(1 if fails else 0)
EOF

# checks.py STEP ADDR OUT: run one group of checks; its ok/FAIL lines count here
run_py() { it_count python3 "$work/checks.py" "$@"; }

# promtool FILE WHAT: the exposition must pass `promtool check metrics` with nothing to say
promcheck() {
  local msg
  msg=$(promtool check metrics <"$1" 2>&1)
  if [[ $? -eq 0 && -z $msg ]]; then ok "promtool check metrics: nothing to report ($2)"
  else bad "promtool check metrics ($2): $msg"; fi
}

run_py basics "$main_addr" "$work/m1.txt"
promcheck "$work/m1.txt" "8 simulated GPUs"
run_py garbage "$main_addr" "$work/m2.txt"
promcheck "$work/m2.txt" "after the garbage"
kill -0 "$main_pid" 2>/dev/null && ok "the exporter is still running after the garbage" \
  || bad "the exporter died"

# --- (4) textfile sensors: a malformed file, then a good one -------------------------------
mkdir -p "$work/tf"
printf 'rk_sensor_vrm_ripple_volts{gpu="0"} 0.0555 garbage here\n' >"$work/tf/bad.prom"
if start tf --sim 2 --interval 1s --listen 127.0.0.1:0 --textfile-dir "$work/tf"; then
  tf_pid=$pid tf_addr=$addr
  run_py unhealthy "$tf_addr" "$work/m3.txt"
  promcheck "$work/m3.txt" "with a malformed textfile"
  rm -f "$work/tf/bad.prom"
  printf '# TYPE rk_sensor_vrm_ripple_volts gauge\nrk_sensor_vrm_ripple_volts{gpu="0"} 0.0555\n' \
    >"$work/tf/good.prom.tmp" && mv "$work/tf/good.prom.tmp" "$work/tf/good.prom"
  run_py healthy "$tf_addr" "$work/m4.txt"
  promcheck "$work/m4.txt" "with a textfile"
  stop "$tf_pid" INT
  [[ ${stopped%% *} == 0 ]] && ok "SIGINT: exit 0 in ${stopped#* }" || bad "SIGINT: $stopped"
else
  bad "exporter with --textfile-dir did not start: $(cat "$work/tf.out" "$work/tf.err")"
fi

# --- (5) SIGTERM ------------------------------------------------------------------------------
stop "$main_pid" TERM
[[ ${stopped%% *} == 0 ]] && ok "SIGTERM: exit 0 in ${stopped#* }" || bad "SIGTERM: $stopped"
if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=1)" \
   "${main_addr##*:}" 2>/dev/null; then bad "the port still accepts connections after exit"
else ok "the port is closed after exit"; fi

it_finish
