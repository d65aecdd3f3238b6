# A rank for tests/it_fds.sh (standard library only). First thing, before it opens anything:
# the descriptors it was started with (/proc/self/fd, each read as a link) and every process
# of the machine that holds one of the --watch files open (pid and argv, from /proc/*/fd),
# and for each of its ancestors that is rk (rk run, a keeper, an agent) the descriptors above
# 2 it holds without close-on-exec; into --out/fds.<RK_LAUNCH>.<RANK>.json (written whole,
# then renamed). Then the
# protocol (docs/protocol.md): hello, one step, bye "done", with rank and world from RANK and
# WORLD_SIZE.
import argparse, json, os, socket

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--watch", action="append", default=[], help="a file rk run holds (repeat)")
a = ap.parse_args()


def links(pid):
    """{fd: target} of a process, {} if it is gone or not ours to read."""
    out = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for n in names:
        try:
            out[n] = os.readlink(f"/proc/{pid}/fd/{n}")
        except OSError:  # closed meanwhile (the listing's own descriptor among them)
            pass
    return out


mine = links("self")
watch = {os.path.realpath(p) for p in a.watch}
holders = []
for pid in (p for p in os.listdir("/proc") if p.isdigit()):
    held = sorted({t for t in links(pid).values() if t in watch})
    if not held:
        continue
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [w.decode(errors="replace") for w in f.read().split(b"\0")[:-1]]
    except OSError:
        continue
    holders.append(dict(pid=int(pid), argv=argv, files=held))



def inheritable(pid):
    """{fd: target} of a process's descriptors above 2 without close-on-exec (fdinfo's flags
    lack O_CLOEXEC, octal 02000000)."""
    out = {}
    for fd, target in links(pid).items():
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                flags = next(int(l.split()[1], 8) for l in f if l.startswith("flags:"))
        except (OSError, StopIteration, ValueError):
            continue
        if int(fd) > 2 and not flags & 0o2000000:
            out[fd] = target
    return out


# this rank's ancestors that are rk (rk run, its keeper; an agent and its keeper): what a
# process they start would inherit from them
rk_ancestors = []
with open("/proc/self/stat") as f:  # pids as /proc numbers them (the job may have a PID namespace)
    pid = int(f.read().rsplit(")", 1)[1].split()[1])
while pid > 1:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [w.decode(errors="replace") for w in f.read().split(b"\0")[:-1]]
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        break
    if argv and os.path.basename(argv[0]) == "rk":
        rk_ancestors.append(dict(pid=pid, argv=argv, inheritable=inheritable(pid)))
    pid = ppid

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
launch = int(os.environ.get("RK_LAUNCH", "0"))
path = os.path.join(a.out, f"fds.{launch}.{rank}.json")
with open(path + ".tmp", "w") as f:
    json.dump(dict(pid=os.getpid(), fds=mine, holders=holders, rk_ancestors=rk_ancestors), f)
os.replace(path + ".tmp", path)

hb = os.environ["RK_HEARTBEAT"]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect("\0" + hb[1:] if hb.startswith("@") else hb)  # "@name": an abstract socket


def send(**m):
    sock.sendall((json.dumps(m, separators=(",", ":")) + "\n").encode())


send(type="hello", v=1, rank=rank, world=world, pid=os.getpid(), device="", step=0)
send(type="step", rank=rank, step=1, loss=1.0, dt=0.01)
send(type="bye", rank=rank, step=1, status="done")
