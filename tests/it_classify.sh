#!/usr/bin/env bash
# rk run classifies failures truthfully, tried with a worker written from docs/protocol.md
# alone (Python, no rekindle code), real ranks forked by rk run: (1) the doc and the supervisor
# agree: the commands the doc lists are the ones the supervisor sends, every event action and
# kind the supervisor treats specially is documented, RK_RESUME means the same in both docs;
# (2) each worker exit status in the doc's table makes rk run do what the table says, with no
# event before the exit (2: stop with exit 2; 3, 5: commfail, guard_failed; 6: stop, exit 1,
# naming the checkpoint directory; counted against the device, or not, as the table says);
# (3) a worker that never connects is "never connected to RK_HEARTBEAT", nobody's device;
# (4) restarts = relaunches done; (5) events are in time order, and lost_steps, recovery_s
# and first_step come from every rank, not rank 0 alone. Skips (77) without mpirun/python3.
set -u
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_classify
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
proto=$RK_SRC/docs/protocol.md

# --- the worker, from the doc alone --------------------------------------------------------
cat >"$work/docworker.py" <<'PY'
# Newline-delimited JSON over the Unix socket in RK_HEARTBEAT (docs/protocol.md); rank and
# world from Open MPI's variables; a JSON checkpoint per rank in RK_CKPT_DIR, resumed when
# RK_RESUME=1 and it exists. --act RANK:LAUNCH:STEP:WHAT (LAUNCH: RK_LAUNCH or *) does WHAT
# when that rank reaches STEP: exitN exits with status N without a word, kill SIGKILLs
# itself. --act-after-rank0: wait until rank 0 has said bye done first (the test's signal:
# it writes bye.<launch>.0 in RK_CKPT_DIR once it has). --no-connect: never connects. Writes
# the environment it saw to env.<launch>.<rank>.json in --log.
import argparse, errno, json, os, signal, socket, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--steps-rank0", type=int)
ap.add_argument("--ckpt-every", type=int, default=5)
ap.add_argument("--sleep", type=float, default=0.05)
ap.add_argument("--act", action="append", default=[])
ap.add_argument("--act-after-rank0", action="store_true")
ap.add_argument("--act-after-hellos", action="store_true")
ap.add_argument("--no-connect", action="store_true")
ap.add_argument("--log")
a = ap.parse_args()
rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
world = int(os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
launch = os.environ.get("RK_LAUNCH", "0")
steps = a.steps_rank0 if rank == 0 and a.steps_rank0 is not None else a.steps
if a.log:
    with open(os.path.join(a.log, f"env.{launch}.{rank}.json"), "w") as f:
        json.dump({k: v for k, v in os.environ.items() if k.startswith("RK_")}, f)
if a.no_connect:  # and leave once orphaned (a teardown that missed it), within 60 s anyway
    with open(os.path.join(a.log or ".", f"pid.{launch}.{rank}"), "w") as f:
        f.write(f"{os.getpid()}\n")
    parent = os.getppid()
    for _ in range(600):
        if os.getppid() != parent:
            break
        time.sleep(0.1)
    sys.exit(1)
devs = os.environ.get("RK_DEVICES", "").split(",")
device = devs[rank] if rank < len(devs) else ""
ckdir = os.environ.get("RK_CKPT_DIR", "")
path = os.path.join(ckdir, f"docworker.rank{rank}.json") if ckdir else ""
step = 0
if ckdir:
    os.makedirs(ckdir, exist_ok=True)
if os.environ.get("RK_RESUME") == "1" and path and os.path.exists(path):
    step = json.load(open(path))["step"]

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ["RK_HEARTBEAT"])
def send(**m):
    sock.sendall((json.dumps(m, separators=(",", ":")) + "\n").encode())
send(type="hello", v=1, rank=rank, world=world, pid=os.getpid(), device=device, step=step)
if ckdir:  # for an act that must wait until every rank has said hello (--act-after-hellos)
    try:
        open(os.path.join(ckdir, f"hello.{launch}.{rank}"), "w").close()
    except OSError:
        pass
sock.setblocking(False)
buf = b""
def stop_asked():
    global buf
    try:
        while True:
            d = sock.recv(4096)
            if not d:
                return False
            buf += d
    except BlockingIOError:
        pass
    *lines, buf = buf.split(b"\n")
    return any(json.loads(l)["cmd"] == "stop" for l in lines)

def save():
    if not path:
        return
    t0 = time.monotonic()
    try:
        with open(path + ".tmp", "w") as f:
            json.dump({"step": step}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
    except OSError as e:  # a storage error: exit status 6
        sys.exit(6 if e.errno in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EIO) else 1)
    send(type="ckpt", rank=rank, step=step, seconds=time.monotonic() - t0)

def rank0_done():  # rank 0 has said bye done in this launch (60 s at most)
    for _ in range(1200):
        if os.path.exists(os.path.join(ckdir, f"bye.{launch}.0")):
            return
        time.sleep(0.05)

def hellos_done():  # every rank of this launch has said hello (a loaded machine is slow)
    for _ in range(600):
        if all(os.path.exists(os.path.join(ckdir, f"hello.{launch}.{r}")) for r in range(world)):
            return
        time.sleep(0.05)

acts = [x.split(":") for x in a.act]
while step < steps:
    for r, l, s_, what in acts:
        if int(r) == rank and l in ("*", launch) and int(s_) == step:
            if a.act_after_hellos:
                hellos_done()
            if a.act_after_rank0:
                rank0_done()
            if what == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            sys.exit(int(what[4:]))
    send(type="comm", rank=rank, step=step)
    time.sleep(a.sleep)
    step += 1
    send(type="step", rank=rank, step=step, loss=1.0 / step, dt=a.sleep)
    if step % a.ckpt_every == 0:
        save()
    if stop_asked():
        save()
        send(type="bye", rank=rank, step=step, status="stopped")
        sys.exit(4)
save()
send(type="bye", rank=rank, step=step, status="done")
if ckdir:  # for an act that must wait until rank 0 has said bye (--act-after-rank0)
    try:
        open(os.path.join(ckdir, f"bye.{launch}.{rank}"), "w").close()
    except OSError:
        pass
PY
worker=(python3 "$work/docworker.py")

# --- (1) the doc and the supervisor agree ---------------------------------------------------
python3 - "$proto" "$RK_SRC/docs/run.md" "$RK_SRC"/src/supervisor/*.c <<'PY' \
  && ok "protocol.md documents every command, event action and kind the supervisor acts on; RK_RESUME agrees with run.md" \
  || bad "protocol.md and the supervisor disagree"
import re, sys
doc, run, srcs = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3:]
src = "".join(open(p).read() for p in srcs)
sec = doc[doc.index("## Supervisor to worker"):]
sec = sec[:sec.index("\n## ", 1)]
block = sec[sec.index("```json"):sec.index("```", sec.index("```json") + 7)]
doc_cmds = set(re.findall(r'\{"cmd":"(\w+)"\}', block))
sent = set(w.lower() for w in re.findall(r'(?:sup_send_all|send_cmd)\([^;]*RK_HB_CMD_(\w+)\)', src))
assert sent and doc_cmds == sent, f"the doc lists commands {sorted(doc_cmds)}, the supervisor sends {sorted(sent)}"
acted = set(re.findall(r'\{"(\w+)", RK_SUP_KIND_\w+, [01]\}', src) + re.findall(r'strcmp\(action, "(\w+)"\)', src))
assert acted, "no event actions or kinds found in the supervisor"
missing = [w for w in sorted(acted) if f"`{w}`" not in doc]
assert not missing, f"the supervisor acts on event values the doc does not name: {missing}"
row = [l for l in doc.splitlines() if l.startswith("| `RK_RESUME`")]
assert row and "every launch" in row[0] and "first" in row[0], f"protocol.md: {row}"
assert re.search(r"RK_RESUME=1`? on every launch, the first included", run), "run.md's RK_RESUME"
print(f"commands {sorted(sent)}; event values {sorted(acted)}")
PY

# --- (2) each exit status as the doc's table says ------------------------------------------
# The table's last column: "relaunch: `KIND`, counted against ..." or "stop, exit N: `KIND`".
python3 - "$proto" >"$work/table" <<'PY' || bad "protocol.md has no exit status table with what rk run does"
import re, sys
doc = open(sys.argv[1]).read()
sec = doc[doc.index("## Exit statuses"):]
rows = 0
for l in sec.splitlines():
    m = re.match(r"\| (\d+) \| `RK_EXIT_\w+` \|.*\| ([^|]*) \|$", l)
    if not m:
        continue
    st, what = m.groups()
    r = re.match(r"relaunch: `(\w+)`, counted against (the rank's device|no device)", what)
    s = re.match(r"stop, exit (\d): `(\w+)`, counted against no device", what)
    if r:
        print(st, "relaunch", r.group(1), int(r.group(2) == "the rank's device"), 0)
        rows += 1
    elif s:
        print(st, "stop", s.group(2), 0, s.group(1))
        rows += 1
sys.exit(rows < 5)
PY
ran=0
while read -r -u 3 st action kind counted rkexit; do
  ran=$((ran + 1))
  n=st$st
  rm -rf "$work/$n.ck"
  # rank 1 (device 1) exits with status $st at step 3 of the first launch, no word said, once
  # both ranks said hello (else rank 0 is rightly "never connected": on a loaded machine it
  # sometimes had not yet, 0.15 s after rank 1's hello); a
  # threshold of 1 quarantines device 1 if (and only if) it is counted; spare device 2
  timeout 120 "$RK" run -n 2 --devices 0,1,2 --failure-threshold 1 --ckpt-dir "$work/$n.ck" \
    --quiet --events "$work/$n.ev" --summary-json "$work/$n.sum" \
    -- "${worker[@]}" --steps 12 --act "1:0:3:exit$st" --act-after-hellos </dev/null >"$work/$n.out" 2>&1
  got=$?
  want=$([[ $action == stop ]] && echo "$rkexit" || echo 0)
  python3 - "$work/$n.ev" "$work/$n.sum" "$st" "$action" "$kind" "$counted" "$got" "$want" <<'PY' \
    && ok "exit status $st: $action ($kind), counted=$counted, rk run exit $want" \
    || bad "exit status $st: $(grep 'rk run' "$work/$n.out" | tail -4)"
import json, sys
evf, sumf, st, action, kind, counted, got, want = sys.argv[1:]
assert got == want, f"rk run exited {got}, the doc says {want}"
ev = [json.loads(l) for l in open(evf)]
mine = [e for e in ev if e["kind"] == kind]
assert len(mine) == 1 and mine[0]["action"] == action and mine[0]["rank"] == 1, f"{kind} events: {ev}"
quar = [e for e in ev if e["kind"] == "quarantine"]
assert len(quar) == int(counted), f"counted={counted} but quarantines {quar}"
assert (mine[0]["device"] == "1") == (counted == "1"), f"device {mine[0]['device']}"
if action == "relaunch":  # a relaunch that ran: recovery and lost steps are known
    assert mine[0]["recovery_s"] is not None and mine[0]["lost_steps"] is not None, mine
    assert mine[0]["lost_steps"] >= 3, f"lost {mine[0]['lost_steps']}: rank 1 had done 3, resumed at 0"
s = json.load(open(sumf))
assert s["restarts"] == (1 if action == "relaunch" else 0), f"restarts {s['restarts']}"
print(f"status {st}: {kind} {action} rank 1, device {mine[0]['device']}, restarts {s['restarts']}")
PY
  if [[ $kind == storage ]]; then
    grep -q "storage error on the checkpoint directory $work/$n.ck" "$work/$n.out" \
      && ok "the storage stop names the checkpoint directory" || bad "storage message: $(grep 'rk run' "$work/$n.out" | tail -3)"
  fi
done 3<"$work/table"
[[ $ran -ge 5 ]] || bad "only $ran exit statuses tried from the doc's table"

# --- (3) a worker that never connects ------------------------------------------------------
timeout 120 "$RK" run -n 1 --startup-timeout 3 --failure-threshold 1 --max-restarts 1 --quiet \
  --events "$work/nc.ev" --summary-json "$work/nc.sum" -- "${worker[@]}" --no-connect \
  --log "$work" >"$work/nc.out" 2>&1
st=$?
for f in "$work"/pid.*; do pids+=("$(cat "$f")"); done  # killed on exit if still there
python3 - "$work/nc.ev" "$work/nc.sum" "$st" <<'PY' \
  && ok "a worker that never connects: 'never connected to RK_HEARTBEAT', no device blamed" \
  || bad "never connected: $(grep 'rk run' "$work/nc.out" | tail -4)"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
s = json.load(open(sys.argv[2]))
assert sys.argv[3] == "1", f"exit {sys.argv[3]}"
nc = [e for e in ev if e["kind"] == "never_connected"]
assert len(nc) == 2 and all("never connected to RK_HEARTBEAT" in e["detail"] for e in nc), ev
assert all(e["device"] is None for e in nc), nc
assert not [e for e in ev if e["kind"] in ("quarantine", "hang")], ev
assert s["quarantined"] == 0 and s["restarts"] == 1, s
PY
grep -q "devices* left" "$work/nc.out" && bad "never connected ended with 'devices left'" \
  || ok "it gives up on restarts, not on devices"

# --- (4) restarts = relaunches done ---------------------------------------------------------
# (a status of its own in each launch: the same one twice before any hello stops at once)
timeout 120 "$RK" run -n 1 --max-restarts 2 --quiet --summary-json "$work/f.sum" -- \
  sh -c 'exit $((RK_LAUNCH + 7))' >"$work/f.out" 2>&1
st=$?
[[ $st == 1 && $(json "$work/f.sum" restarts) == 2 ]] \
  && grep -q "after 2 relaunches (--max-restarts 2)" "$work/f.out" \
  && ok "--max-restarts 2, a worker that fails before its hello: 2 restarts in the summary, exit 1" \
  || bad "max-restarts 2: exit $st, restarts $(json "$work/f.sum" restarts 2>/dev/null): $(grep 'rk run' "$work/f.out" | tail -2)"

# --- (5) time order; lost_steps, recovery_s, first_step from every rank ---------------------
# Rank 0 finishes at step 10; then rank 1 (device 1) is SIGKILLed at step 37 (checkpoint 35).
# The relaunch: rank 0 resumes at 10 and only says bye, rank 1 resumes at 35 and steps. A
# threshold of 1 quarantines device 1 right after the crash.
timeout 120 "$RK" run -n 2 --devices 0,1,2 --failure-threshold 1 --ckpt-dir "$work/ev.ck" \
  --quiet --events "$work/ev.ev" --summary-json "$work/ev.sum" -- "${worker[@]}" --steps 45 \
  --steps-rank0 10 --act-after-rank0 --act 1:0:37:kill --log "$work" >"$work/ev.out" 2>&1
st=$?
python3 - "$work/ev.ev" "$work/ev.sum" "$st" <<'PY' \
  && ok "events in time order; the crash's lost_steps and recovery_s come from rank 1" \
  || bad "every rank: $(grep 'rk run' "$work/ev.out" | tail -4)"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
assert sys.argv[3] == "0", f"exit {sys.argv[3]}"
ts = [e["t"] for e in ev]
assert ts == sorted(ts), f"events out of time order: {[(e['kind'], e['t']) for e in ev]}"
crash = [e for e in ev if e["kind"] == "crash"]
assert len(crash) == 1 and crash[0]["rank"] == 1, ev
assert crash[0]["lost_steps"] == 2, f"lost_steps {crash[0]['lost_steps']} (37 reached, resumed at 35)"
assert crash[0]["recovery_s"] is not None and crash[0]["recovery_s"] > 0, crash
# the snapshot notes (docs/run.md, "Accounting") are not incidents
inc = [e["kind"] for e in ev if e["kind"] not in ("snapshot_on", "snapshot_held", "snapshot_peak")]
assert inc == ["crash", "quarantine"], [e["kind"] for e in ev]
s = json.load(open(sys.argv[2]))
assert s["steps"] == 45 and s["restarts"] == 1 and s["recovery_max_s"] is not None, s
print(f"crash lost {crash[0]['lost_steps']} steps, recovered in {crash[0]['recovery_s']} s")
PY
python3 - "$work" <<'PY' && ok "RK_RESUME=1 on every launch, the first included (as both docs say)" \
  || bad "RK_RESUME per launch"
import json, sys
for launch in (0, 1):
    for rank in (0, 1):
        e = json.load(open(f"{sys.argv[1]}/env.{launch}.{rank}.json"))
        assert e.get("RK_RESUME") == "1" and e.get("RK_LAUNCH") == str(launch), (launch, rank, e)
PY
# first_step: rank 0 resumes at 8, rank 1 at 4: the job began at 4
mkdir -p "$work/fs.ck"
echo '{"step": 8}' >"$work/fs.ck/docworker.rank0.json"
echo '{"step": 4}' >"$work/fs.ck/docworker.rank1.json"
timeout 120 "$RK" run -n 2 --ckpt-dir "$work/fs.ck" --quiet --summary-json "$work/fs.sum" \
  -- "${worker[@]}" --steps 12 >"$work/fs.out" 2>&1
[[ $? == 0 && $(json "$work/fs.sum" first_step) == 4 && $(json "$work/fs.sum" steps) == 12 ]] \
  && ok "first_step 4: the least of the ranks' hellos (rank 0 resumed at 8)" \
  || bad "first_step $(json "$work/fs.sum" first_step 2>/dev/null): $(grep 'rk run' "$work/fs.out" | tail -2)"

it_finish
