#!/usr/bin/env bash
# The node link over 127.0.0.1 (docs/cluster.md): `rk _coordinator` (the node table of rk run)
# and `rk agent`s. Three nodes join (one through a relay that records its first frame); an
# agent with a wrong secret is refused with one line and exits 1 while the others stay; the
# recorded HELLO sent again on a new connection is refused as a replay; a SIGSTOPped agent is
# lost by silence and rejoins after SIGCONT; a SIGKILLed agent is lost within the node timeout
# + 1 s (the times are printed); the coordinator's BYE ends the other agents with exit 0; a
# coordinator of a newer launch fences an agent of the earlier one off (it retries, then gives
# up with exit 1); bad flags exit 2. A flood of connections without the secret (connect and
# close, connect and say nothing) while an agent joins: the agent joins, and the coordinator
# logs a few refusals and then their count, not a line each; an agent whose first connections
# are closed before WELCOME retries and joins; a flood on an agent's abstract socket is a few
# lines and a count too. Every process is stopped by its pid. Skips (77) without python3.
set -u
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_agent

now() { date +%s.%N; }
# since T0: seconds from T0 to now, 2 decimals
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
# wait_line FILE PATTERN SECONDS: poll until a line of FILE matches (grep -E)
wait_line() {
  local i
  for ((i = 0; i < $3 * 50; i++)); do grep -qE -- "$2" "$1" 2>/dev/null && return 0; sleep 0.02; done
  return 1
}
lines() { grep -cE -- "$2" "$1"; }

python3 -c "import secrets; print(secrets.token_hex(32))" >"$work/secret"
python3 -c "import secrets; print(secrets.token_hex(32))" >"$work/wrong"
chmod 600 "$work/secret" "$work/wrong"
job=$(python3 -c "import secrets; print(secrets.token_hex(16))")

# --- bad flags: exit 2 ---------------------------------------------------------------------
expect2() {
  local rc
  "$@" </dev/null >"$work/flags.out" 2>&1
  rc=$?
  if [[ $rc == 2 ]]; then ok "exit 2: ${*:2}"; else bad "exit $rc (not 2): ${*:2}"; cat "$work/flags.out"; fi
}
expect2 "$RK" agent
expect2 "$RK" agent --coordinator 127.0.0.1:1 --node 0
expect2 "$RK" agent --coordinator 127.0.0.1 --node 0 --job-id "$job"
expect2 "$RK" agent --coordinator 127.0.0.1:1 --node x --job-id "$job"
expect2 "$RK" agent --coordinator 127.0.0.1:1 --node 0 --job-id 12zz
expect2 "$RK" agent --coordinator 127.0.0.1:1 --node 0 --job-id "$job" --ping-interval 0
expect2 "$RK" agent --coordinator 127.0.0.1:1 --node 0 --job-id "$job" --secret "$(cat "$work/secret")"
expect2 "$RK" agent --coordinator 127.0.0.1:1 --node 0 --job-id "$job" # no secret on stdin
expect2 "$RK" _coordinator --listen 127.0.0.1:0 --secret-file "$work/secret" --job-id "$job"
expect2 "$RK" _coordinator --listen 127.0.0.1:0 --nodes 2 --secret-file "$work/none" --job-id "$job"
chmod 644 "$work/wrong"
expect2 "$RK" _coordinator --listen 127.0.0.1:0 --nodes 2 --secret-file "$work/wrong" --job-id "$job"
chmod 600 "$work/wrong"
if "$RK" --help | grep -q '^  agent ' && ! "$RK" --help | grep -q _coordinator; then
  ok "rk --help lists agent and not _coordinator"
else
  bad "rk --help lists agent and not _coordinator"
fi
"$RK" agent --help | grep -q -- '--secret-file' && ok "rk agent --help" || bad "rk agent --help"
# --watch --socket-node: the ranks' socket is @rk-JOBID-NODE with the node's name as given
# (srun's ranks put SLURMD_NODENAME there as it is: an upper-case name must stay one)
ujob=$(tr a-f A-F <<<"$job")
"$RK" agent --coordinator 127.0.0.1:1 --node 0 --job-id "$ujob" --secret-file "$work/secret" \
  --watch --socket-node DGX-A100-01 --reconnect-for 10s 2>"$work/sn.err" &
snp=$!
pids+=("$snp")
seen=''
for ((i = 0; i < 100; i++)); do
  grep -q "@rk-$job-DGX-A100-01\$" /proc/net/unix && { seen=1; break; }
  sleep 0.05
done
kill "$snp" 2>/dev/null
wait "$snp" 2>/dev/null
[[ -n $seen ]] && ok "--socket-node DGX-A100-01: the socket @rk-JOBID-DGX-A100-01 (the job id in lower case, the node's name as given)" \
  || bad "--socket-node: no @rk-$job-DGX-A100-01 in /proc/net/unix: $(grep -o "@rk-[^ ]*" /proc/net/unix | head -3) $(head -2 "$work/sn.err")"

# --- the coordinator and two agents ----------------------------------------------------------
"$RK" _coordinator --listen 127.0.0.1:0 --nodes 3 --secret-file "$work/secret" --job-id "$job" \
  --node-timeout 2 >"$work/coord.out" 2>&1 &
coord=$!
pids+=("$coord")
wait_line "$work/coord.out" 'listening on .* port [0-9]+' 5 || { bad "the coordinator did not start"; cat "$work/coord.out"; it_finish; exit; }
port=$(sed -nE 's/.*port ([0-9]+).*/\1/p' "$work/coord.out" | head -1)
coordinator=127.0.0.1:$port

"$RK" agent --coordinator "$coordinator" --node 0 --job-id "$job" <"$work/secret" 2>"$work/a0.err" &
a0=$!
pids+=("$a0")
"$RK" agent --coordinator "$coordinator" --node 1 --job-id "$job" --secret-file "$work/secret" \
  --ping-interval 200ms 2>"$work/a1.err" &
a1=$!
pids+=("$a1")
if wait_line "$work/coord.out" '^node 0 joined' 5 && wait_line "$work/coord.out" '^node 1 joined' 5; then
  ok "two agents joined"
else
  bad "two agents joined"
fi

# --- a wrong secret: one line, the agent exits 1, the others stay ------------------------------
# (--reconnect-for 0: one try; with more, it tries again, as after any close before WELCOME)
"$RK" agent --coordinator "$coordinator" --node 1 --job-id "$job" --reconnect-for 0 \
  <"$work/wrong" 2>"$work/wrong.err"
rc=$?
[[ $rc == 1 ]] && ok "a wrong secret: the agent exits 1" || bad "a wrong secret: the agent exits $rc"
grep -q 'the coordinator closed the link (wrong secret or job id?)' "$work/wrong.err" &&
  ok "the agent says the coordinator closed the link" || { bad "the agent's line"; cat "$work/wrong.err"; }
# the agent made one connection (--reconnect-for 0) and has exited: the line is there or coming
wait_line "$work/coord.out" '^refused 127\.0\.0\.1:[0-9]+: wrong secret' 10
n=$(lines "$work/coord.out" '^refused 127\.0\.0\.1:[0-9]+: wrong secret')
[[ $n == 1 ]] && ok "the coordinator logs the wrong secret once, naming the peer" || bad "$n wrong-secret lines"
[[ $(lines "$work/coord.out" 'lost') == 0 ]] && kill -0 "$coord" && ok "the coordinator keeps serving the others" ||
  bad "the others were disturbed"

# --- a replayed frame: recorded by a relay, sent again on a new connection -------------------
cat >"$work/relay.py" <<'PY'
# relay.py LISTEN_PORT_FILE TARGET_PORT FRAME_FILE: accept one connection, relay it both ways
# to 127.0.0.1:TARGET_PORT, and write the first whole frame the client sends to FRAME_FILE.
import selectors, socket, struct, sys
port_file, target, frame_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)
open(port_file, "w").write("%d\n" % ls.getsockname()[1])
c, _ = ls.accept()
u = socket.create_connection(("127.0.0.1", target))
sel = selectors.DefaultSelector()
sel.register(c, selectors.EVENT_READ, u); sel.register(u, selectors.EVENT_READ, c)
seen, saved = b"", False
while True:
    for key, _ in sel.select():
        data = key.fileobj.recv(65536)
        if not data:
            sys.exit(0)
        if key.fileobj is c and not saved:
            seen += data
            if len(seen) >= 24:
                total = 48 + struct.unpack_from("<I", seen, 20)[0] + 32
                if len(seen) >= total:
                    open(frame_file, "wb").write(seen[:total]); saved = True
        key.data.sendall(data)
PY
python3 "$work/relay.py" "$work/relay.port" "$port" "$work/hello.bin" &
relay=$!
pids+=("$relay")
wait_line "$work/relay.port" '^[0-9]+$' 5
"$RK" agent --coordinator "127.0.0.1:$(cat "$work/relay.port")" --node 2 --job-id "$job" \
  <"$work/secret" 2>"$work/a2.err" &
a2=$!
pids+=("$a2")
wait_line "$work/coord.out" '^node 2 joined' 5 && [[ -s $work/hello.bin ]] &&
  ok "node 2 joined through the relay, its HELLO recorded" || bad "node 2 through the relay"
python3 - "$port" "$work/hello.bin" <<'PY'
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(open(sys.argv[2], "rb").read())
s.settimeout(3)
try:
    print("replay: the coordinator answered %d bytes" % len(s.recv(100)))
except Exception as e:
    print("replay: %s" % e)
PY
wait_line "$work/coord.out" '^refused 127\.0\.0\.1:[0-9]+: replayed frame seq 1 ' 3 &&
  ok "the replayed HELLO is refused" || bad "the replayed HELLO is refused"
[[ $(lines "$work/coord.out" '^node 2 lost') == 0 ]] && ok "node 2 stays after the replay" ||
  bad "node 2 was lost after the replay"

# --- SIGSTOP: lost by silence; SIGCONT: rejoined ----------------------------------------------
t0=$(now)
kill -STOP "$a1"
if wait_line "$work/coord.out" '^node 1 lost after .* silent' 6; then
  dt=$(since "$t0")
  echo "SIGSTOP: node 1 lost after $dt s (node timeout 2 s)"
  awk -v d="$dt" 'BEGIN { exit !(d < 4.5) }' && ok "a stopped agent is lost by silence ($dt s)" ||
    bad "a stopped agent lost only after $dt s"
else
  bad "a stopped agent is lost by silence"
fi
kill -CONT "$a1"
wait_line "$work/coord.out" '^node 1 rejoined' 8 && ok "after SIGCONT it rejoins" ||
  { bad "after SIGCONT it rejoins"; cat "$work/a1.err"; }

# --- SIGKILL: lost within the node timeout + 1 s ---------------------------------------------
t0=$(now)
kill -KILL "$a0"
if wait_line "$work/coord.out" '^node 0 lost' 6; then
  dt=$(since "$t0")
  echo "SIGKILL: node 0 lost after $dt s (node timeout 2 s)"
  awk -v d="$dt" 'BEGIN { exit !(d < 3.5) }' && ok "a killed agent is lost within the timeout + 1 s ($dt s)" ||
    bad "a killed agent lost only after $dt s"
else
  bad "a killed agent is lost"
fi
wait "$a0" 2>/dev/null

# --- a new agent process for node 0, same launch: its sequence numbers start again -----------
"$RK" agent --coordinator "$coordinator" --node 0 --job-id "$job" --reconnect-for 0 \
  <"$work/secret" 2>"$work/again.err"
rc=$?
[[ $rc == 1 ]] && grep -q 'closed the link' "$work/again.err" &&
  wait_line "$work/coord.out" '^refused .*: replayed frame seq 1 <= [0-9]+ .*' 2 &&
  [[ $(lines "$work/coord.out" '^refused .*replayed') == 2 ]] &&
  ok "a restarted agent is refused as replaying until the next launch" ||
  { bad "a restarted agent (exit $rc)"; cat "$work/again.err"; }

# --- a node this job does not have: REFUSED, exit 1 with the reason ---------------------------
"$RK" agent --coordinator "$coordinator" --node 5 --job-id "$job" <"$work/secret" 2>"$work/n5.err"
rc=$?
[[ $rc == 1 ]] && grep -q 'refused node 5: node 5 is not in this job' "$work/n5.err" &&
  ok "node 5 of a 3-node job is refused, exit 1" || { bad "node 5 (exit $rc)"; cat "$work/n5.err"; }

# --- SIGTERM to an agent: it says BYE, the node left ------------------------------------------
kill -TERM "$a1"
wait "$a1"
rc=$?
[[ $rc == 0 ]] && wait_line "$work/coord.out" '^node 1 left: the agent was stopped' 2 &&
  ok "an agent stopped by SIGTERM says BYE (exit 0, node 1 left)" || bad "SIGTERM to an agent (exit $rc)"

# --- the coordinator's BYE: the agents exit 0 -------------------------------------------------
kill -TERM "$coord"
wait "$coord"
rc=$?
[[ $rc == 0 ]] && ok "the coordinator stops on SIGTERM, exit 0" || bad "the coordinator exits $rc"
wait "$a2"
rc=$?
[[ $rc == 0 ]] && ok "the last agent exits 0 on the coordinator's BYE" || bad "the last agent exits $rc on BYE"
grep -q 'said BYE' "$work/a2.err" && ok "the agent says the coordinator said BYE" || bad "no BYE line"
kill "$relay" 2>/dev/null
wait "$relay" 2>/dev/null

# --- a coordinator of a newer launch fences an agent off: it retries, then gives up ----------
"$RK" _coordinator --listen 127.0.0.1:0 --nodes 1 --secret-file "$work/secret" --job-id "$job" \
  --node-timeout 2 >"$work/c1.out" 2>&1 &
c1=$!
pids+=("$c1")
wait_line "$work/c1.out" 'listening on .* port [0-9]+' 5
port1=$(sed -nE 's/.*port ([0-9]+).*/\1/p' "$work/c1.out" | head -1)
"$RK" agent --coordinator "127.0.0.1:$port1" --node 0 --job-id "$job" --reconnect-for 2 \
  <"$work/secret" 2>"$work/f.err" &
af=$!
pids+=("$af")
wait_line "$work/c1.out" '^node 0 joined' 5
kill -KILL "$c1"
wait "$c1" 2>/dev/null
"$RK" _coordinator --listen "127.0.0.1:$port1" --nodes 1 --secret-file "$work/secret" \
  --job-id "$job" --generation 2 --for 6 >"$work/c2.out" 2>&1 &
c2=$!
pids+=("$c2")
wait "$af"
rc=$?
[[ $rc == 1 ]] && grep -q 'no link to the coordinator for 2 s' "$work/f.err" &&
  ok "an agent fenced off by a newer launch retries, then gives up (exit 1)" ||
  { bad "a fenced agent (exit $rc)"; cat "$work/f.err"; }
grep -qE '^refused 127\.0\.0\.1:[0-9]+: frame of launch 1 from .*, this is launch 2' "$work/c2.out" &&
  ok "the newer launch's coordinator refuses the agent's frames as fenced" ||
  { bad "no fenced line"; cat "$work/c2.out"; }
kill -TERM "$c2"
wait "$c2" 2>/dev/null

# --- a flood of connections without the secret while an agent joins -------------------------
cat >"$work/flood.py" <<'PY'
# flood.py tcp ADDR PORT SECONDS | unix NAME SECONDS: from 4 threads for SECONDS, connect and
# close at once, and connect and say nothing (8 a thread held open, the oldest then closed);
# prints how many connections were made.
import socket, sys, threading, time
made, lock = [0], threading.Lock()
def connect():
    if sys.argv[1] == "tcp":
        return socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=2)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    s.connect("\0" + sys.argv[2])
    return s
def run(secs):
    n, held, end = 0, [], time.monotonic() + secs
    while time.monotonic() < end:
        try:
            s = connect()
        except OSError:
            continue
        n += 1
        if n % 2:
            s.close()
        else:
            held.append(s)
            if len(held) > 8:
                held.pop(0).close()
    for s in held:
        s.close()
    with lock:
        made[0] += n
ts = [threading.Thread(target=run, args=(float(sys.argv[-1]),)) for _ in range(4)]
for t in ts: t.start()
for t in ts: t.join()
print(made[0])
PY
"$RK" _coordinator --listen 127.0.0.1:0 --nodes 3 --secret-file "$work/secret" --job-id "$job" \
  --node-timeout 5 >"$work/c3.out" 2>&1 &
c3=$!
pids+=("$c3")
wait_line "$work/c3.out" 'listening on .* port [0-9]+' 5
port3=$(sed -nE 's/.*port ([0-9]+).*/\1/p' "$work/c3.out" | head -1)
python3 "$work/flood.py" tcp 127.0.0.1 "$port3" 4 >"$work/flood.n" 2>&1 &
fl=$!
pids+=("$fl")
wait_line "$work/c3.out" '^refused ' 5 # the flood is under way
"$RK" agent --coordinator "127.0.0.1:$port3" --node 0 --job-id "$job" --reconnect-for 30 \
  <"$work/secret" 2>"$work/fa.err" &
fa=$!
pids+=("$fa")
wait_line "$work/c3.out" '^node 0 joined' 15 && kill -0 "$fa" 2>/dev/null &&
  ok "an agent joins during a flood of connections without the secret" ||
  { bad "an agent during a flood: $(tail -3 "$work/fa.err")"; }
wait "$fl"
made=$(cat "$work/flood.n")
shown=$(lines "$work/c3.out" '^refused 127\.0\.0\.1:')
echo "flood on --listen: $made connections in 4 s, $shown refusal lines"
[[ $made -ge 100 && $shown -ge 1 && $shown -le 10 ]] &&
  ok "the flood's $made refused connections are $shown lines, not one a connection" ||
  bad "$shown refusal lines for $made connections"

# --- an agent whose connections are closed before WELCOME: it retries ------------------------
cat >"$work/gate.py" <<'PY'
# gate.py PORT_FILE TARGET_PORT CLOSE_N: listen on 127.0.0.1 (its port into PORT_FILE); the
# first CLOSE_N connections are closed at once, unread (a coordinator that had to close them),
# the next ones relayed both ways to 127.0.0.1:TARGET_PORT.
import socket, sys, threading
port_file, target, close_n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(8)
open(port_file, "w").write("%d\n" % ls.getsockname()[1])
def pump(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    for x in (a, b):
        try:
            x.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
n = 0
while True:
    c, _ = ls.accept()
    n += 1
    if n <= close_n:
        c.close()
        continue
    u = socket.create_connection(("127.0.0.1", target))
    threading.Thread(target=pump, args=(c, u), daemon=True).start()
    threading.Thread(target=pump, args=(u, c), daemon=True).start()
PY
python3 "$work/gate.py" "$work/gate.port" "$port3" 2 &
gate=$!
pids+=("$gate")
wait_line "$work/gate.port" '^[0-9]+$' 5
"$RK" agent --coordinator "127.0.0.1:$(cat "$work/gate.port")" --node 2 --job-id "$job" \
  --reconnect-for 30 <"$work/secret" 2>"$work/fg.err" &
fg=$!
pids+=("$fg")
if wait_line "$work/c3.out" '^node 2 joined' 10 && kill -0 "$fg" 2>/dev/null; then
  ok "an agent whose first 2 connections were closed before WELCOME retried and joined ($(lines "$work/fg.err" 'link lost before WELCOME') closes said)"
else
  bad "an agent closed before WELCOME: $(tail -2 "$work/fg.err")"
fi

# --- a flood on an agent's abstract socket (anyone on the host can connect) ------------------
"$RK" agent --coordinator "127.0.0.1:$port3" --node 1 --job-id "$job" --watch \
  --reconnect-for 30 <"$work/secret" 2>"$work/fb.err" &
fb=$!
pids+=("$fb")
wait_line "$work/fb.err" 'joined 127' 5
python3 "$work/flood.py" unix "rk-$job" 3 >"$work/aflood.n" 2>&1
made=$(cat "$work/aflood.n")
shown=$(lines "$work/fb.err" 'closed a heartbeat connection')
echo "flood on @rk-JOBID: $made connections in 3 s, $shown lines"
[[ $made -ge 100 && $shown -ge 1 && $shown -le 10 ]] &&
  ok "the abstract socket's $made closed connections are $shown lines, not one a connection" ||
  bad "$shown lines for $made connections on the abstract socket: $(tail -2 "$work/fb.err")"
# ... then their counts, once the rate limit's window (10 s) has ended
wait_line "$work/c3.out" '^refused [0-9]+ more connections in 10 s' 15 &&
  ok "then one line with the count: $(grep -m1 'more connections' "$work/c3.out")" ||
  bad "no count of the refusals: $(tail -2 "$work/c3.out")"
wait_line "$work/fb.err" 'closed [0-9]+ more heartbeat connections in 10 s' 15 &&
  ok "the agent says the count: $(grep -m1 'more heartbeat' "$work/fb.err")" ||
  bad "no count on the agent: $(tail -2 "$work/fb.err")"
kill -TERM "$c3"
wait "$c3" 2>/dev/null
wait "$fa"
rc=$?
wait "$fb"
rc2=$?
wait "$fg"
rc3=$?
[[ $rc == 0 && $rc2 == 0 && $rc3 == 0 ]] && ok "the agents end on the coordinator's BYE (exit 0)" ||
  bad "the agents exit $rc, $rc2 and $rc3"
kill "$gate" 2>/dev/null
wait "$gate" 2>/dev/null
echo "--- coordinator"
cat "$work/coord.out"
it_finish
