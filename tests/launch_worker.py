# A rank for tests/it_launch_local.sh, written from docs/run.md and docs/protocol.md alone
# (standard library only): rank and world from RANK and WORLD_SIZE, nothing else. Writes the
# environment it got to --log/env.<RK_LAUNCH>.<RANK>.json, says hello (with "stacks": true
# after registering faulthandler on SIGUSR1 to write every thread's stack to
# $RK_STACK_DIR/stacks-rank<RANK>-launch<RK_LAUNCH>.txt), steps every 20 ms and says bye.
# Faults, for rank --rank only, in the launches listed: --crash-at STEP SIGKILLs itself (once
# every rank of the launch said hello, with --log), --hang-at STEP enters
# hung_in_compute_for_test(), which never returns; --stop-delay S: on {"cmd":"stop"} wait S
# seconds before saying bye "stopped", writing --log/stopped.<launch>.<rank> and exiting 4
# (the other ranks stop at once). --read-stdin: after the hello, read a line of stdin and
# write what came (and what fd 0 is) to --log/stdin.<launch>.<rank>.json. --child TAG: start
# a child process (python3 sleeping, TAG in its argv) that outlives nothing. --hostile-stacks:
# on SIGUSR1 write a dump, then swap a symlink to --hostile-target in for it. --raise-at STEP:
# what the Python package does for an exception of the job's code (docs/protocol.md): an
# exit event of kind "exception" (--raise-kind) with --raise-detail, then exit 1
# (--raise-status). --die-after-bye: every
# rank writes --log/bye.<launch>.<rank> after its bye "done"; rank --rank then waits for all
# of them and SIGKILLs itself (a process that dies after the job's work was done).
# --lend-socket PATH: rank --rank sends its heartbeat socket to a process listening at PATH,
# which keeps it open after the rank dies (a DataLoader worker forked from the rank would).
# --ompi-rank, --ompi-world:
# rank and world from OMPI_COMM_WORLD_RANK and _SIZE instead (0 and 1 when unset), as a worker
# written to the first protocol doc did. --hello-again: a second connection of this process
# says the same hello (and stays open); --child-hello: a child process says this rank's hello
# with its own pid (as a multiprocessing child that ran the worker's setup again), then sleeps.
import argparse, faulthandler, json, os, signal, socket, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40, help="steps in the launches after the first")
ap.add_argument("--steps-first", type=int, help="steps in launch 0 (default --steps)")
ap.add_argument("--rank", type=int, default=1, help="the rank the faults are for")
ap.add_argument("--launches", default="0", help="launches the faults fire in (comma list)")
ap.add_argument("--crash-at", type=int)
ap.add_argument("--hang-at", type=int)
ap.add_argument("--stop-delay", type=float, default=0.0)
ap.add_argument("--log")
ap.add_argument("--read-stdin", action="store_true")
ap.add_argument("--child")
ap.add_argument("--hostile-stacks", action="store_true")
ap.add_argument("--hostile-target", default="/etc/hostname")
ap.add_argument("--raise-at", type=int)
ap.add_argument("--raise-detail", default="ValueError: bad value (train.py:12)")
ap.add_argument("--raise-kind", default="exception", help="the --raise-at exit event's kind")
ap.add_argument("--raise-status", type=int, default=1, help="the --raise-at exit status")
ap.add_argument("--die-after-bye", action="store_true",
                help="after its bye done, SIGKILL itself once every rank said bye (needs --log)")
ap.add_argument("--lend-socket", metavar="PATH",
                help="rank --rank: after the hello, send its heartbeat socket to PATH (SCM_RIGHTS)")
ap.add_argument("--tag", help="ignored: marks the rank's argv")
ap.add_argument("--ompi-rank", action="store_true")
ap.add_argument("--ompi-world", action="store_true")
ap.add_argument("--hello-again", action="store_true")
ap.add_argument("--child-hello", action="store_true")
a = ap.parse_args()
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0") if a.ompi_rank else os.environ["RANK"])
world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1") if a.ompi_world else os.environ["WORLD_SIZE"])
launch = int(os.environ.get("RK_LAUNCH", "0"))
steps = a.steps_first if launch == 0 and a.steps_first is not None else a.steps
mine = rank == a.rank and str(launch) in a.launches.split(",")
if a.log:
    with open(os.path.join(a.log, f"env.{launch}.{rank}.json"), "w") as f:
        json.dump(dict(os.environ, pid=str(os.getpid())), f)
dump = None
if os.environ.get("RK_STACK_DIR"):
    path = os.path.join(os.environ["RK_STACK_DIR"], f"stacks-rank{rank}-launch{launch}.txt")
    dump = open(path, "w")
    if a.hostile_stacks:
        def swap(signum, frame):
            dump.write("Thread 0x1 (most recent call first):\n  File x, line 1 in hostile\n")
            dump.flush()
            time.sleep(0.1)  # rk run sees it grow, then a link stands in its place
            os.symlink(a.hostile_target, path + ".lnk")
            os.replace(path + ".lnk", path)
        signal.signal(signal.SIGUSR1, swap)
    else:
        faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True, chain=False)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ["RK_HEARTBEAT"])


def send(**m):
    sock.sendall((json.dumps(m, separators=(",", ":")) + "\n").encode())


hello = dict(type="hello", v=1, rank=rank, world=world, pid=os.getpid(), device="", step=0)
if dump:
    hello["stacks"] = True
send(**hello)
if a.lend_socket and mine:  # the connection now outlives this process (as in a child of it)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as lend:
        lend.connect(a.lend_socket)
        socket.send_fds(lend, [b"x"], [sock.fileno()])
        lend.recv(1)  # the holder has it
if a.hello_again:
    again = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    again.connect(os.environ["RK_HEARTBEAT"])
    again.sendall((json.dumps(hello, separators=(",", ":")) + "\n").encode())
if a.child_hello:
    import subprocess
    kid = subprocess.Popen([sys.executable, "-c", "import json, os, socket, sys, time\n"
                            "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                            "s.connect(os.environ['RK_HEARTBEAT'])\n"
                            "m = dict(json.loads(sys.argv[1]), pid=os.getpid())\n"
                            "s.sendall((json.dumps(m) + '\\n').encode())\n"
                            "print('sent', flush=True)\n"
                            "time.sleep(300)\n", json.dumps(hello)], stdout=subprocess.PIPE)
    kid.stdout.readline()  # its hello is out (or it died: then nothing was said)
if a.log:  # for a fault that waits for every rank's hello
    open(os.path.join(a.log, f"hello.{launch}.{rank}"), "w").close()
if a.child:
    import subprocess
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", a.child])
if a.read_stdin:
    got = sys.stdin.readline()
    with open(os.path.join(a.log, f"stdin.{launch}.{rank}.json"), "w") as f:
        json.dump(dict(line=got, fd0=os.readlink("/proc/self/fd/0")), f)


def hung_in_compute_for_test():
    while True:
        time.sleep(0.05)


sock.setblocking(False)
buf = b""


def stop_asked():
    global buf
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                sys.exit(1)  # the supervisor has gone
            buf += data
    except BlockingIOError:
        pass
    return b'"stop"' in buf


for step in range(1, steps + 1):
    time.sleep(0.02)
    if stop_asked():
        time.sleep(a.stop_delay if rank == a.rank else 0.0)
        if a.log:
            open(os.path.join(a.log, f"stopped.{launch}.{rank}"), "w").close()
        send(type="bye", rank=rank, step=step - 1, status="stopped")
        sys.exit(4)
    if mine and step == a.hang_at:
        hung_in_compute_for_test()
    if mine and step == a.raise_at:
        send(type="event", rank=rank, step=step, kind=a.raise_kind, blame=rank, action="exit",
             lost_steps=0, detail=a.raise_detail)
        sys.exit(a.raise_status)
    if mine and step == a.crash_at:
        for _ in range(600):  # else a rank killed before its hello is "never connected"
            if not a.log or all(os.path.exists(os.path.join(a.log, f"hello.{launch}.{r}"))
                                for r in range(world)):
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    send(type="comm", rank=rank, step=step - 1)
    send(type="step", rank=rank, step=step, loss=1.0, dt=0.02)
send(type="bye", rank=rank, step=steps, status="done")
if a.log and a.die_after_bye:
    open(os.path.join(a.log, f"bye.{launch}.{rank}"), "w").close()
    if mine:
        for _ in range(600):
            if all(os.path.exists(os.path.join(a.log, f"bye.{launch}.{r}")) for r in range(world)):
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
