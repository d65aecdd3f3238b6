#!/usr/bin/env python3
"""A tiny training worker that speaks the rekindle heartbeat protocol (docs/protocol.md).

It fits y = 3x + 2 with SGD on synthetic data. Every step's batch comes from its own seeded
generator, random.Random(seed * 1000003 + step), and the only other randomness (a per-step
learning-rate jitter) comes from one generator whose state is checkpointed; so a run that is
killed and resumed ends with bitwise the same w and b as a run that was never interrupted.

    python3 examples/python_worker.py --steps 200
    python3 examples/python_worker.py --steps 200 --ckpt-dir /tmp/ck      # kill -9 it, then
    python3 examples/python_worker.py --steps 200 --ckpt-dir /tmp/ck --resume

Exit statuses (docs/protocol.md): 0 done, 1 failed, 2 bad usage, 4 stopped on command, 6 its
checkpoint could not be written for a storage error (no space, read-only, permission, I/O).

Under `rk run` the supervisor sets RK_HEARTBEAT (its socket), RK_CKPT_DIR, RK_RESUME,
RK_DEVICES, RANK and WORLD_SIZE (without those two, the launcher's variables say them).
Without RK_HEARTBEAT the worker runs standalone. Python 3 standard library only.

Its ranks are independent: no collective, each rank fits its own copy from the same batches
and checkpoints it in a file of its own, so a rank's state never depends on another's and the
ranks need not stop at the same step. What they do agree on is leaving. Under mpirun the first
rank that exits with a status other than 0 makes mpirun kill the others at once, so a rank that
stopped on command and exited 4 at once would kill a slower one before its stop checkpoint was
written. So a rank that stopped (or finished) says so with a file in the checkpoint directory,
python_worker.rank<R>.left, and a rank that stopped exits only when every rank's is there
(or after --stop-wait seconds, for ranks whose directories are not shared). Each rank removes
its own file when it starts, before it says hello (a stop only reaches a rank after its hello),
so a file left from an earlier launch belongs to a rank that has not started training in this
one, and has nothing to lose.
"""

import argparse
import errno
import json
import math
import os
import random
import socket
import sys
import time

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_COMM, EXIT_STOPPED, EXIT_GUARD = 0, 1, 2, 3, 4, 5
EXIT_STORAGE = 6  # the checkpoint directory is full, read-only, not writable or failing
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}
STOP_WAIT_S = 60.0  # default --stop-wait: how long a stopped rank waits for the others
LINE_MAX = 4096  # bytes per protocol line, newline included
STATE_FORMAT = "rekindle-python-worker-1"


def rank_world():
    """Rank and world size: RANK and WORLD_SIZE (rk run sets them under every launcher, as
    torchrun does), else the launcher's own (Open MPI, PMI, Slurm); 0 of 1 without one."""
    for r, w in (("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("PMI_RANK", "PMI_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if r in os.environ and w in os.environ:
            return int(os.environ[r]), int(os.environ[w])
    return 0, 1


def outside_pid():
    """This process's pid as seen from outside the job: rk run starts the job in a PID
    namespace of its own, where getpid() is another number. /proc is the host's, so the
    first NSpid of /proc/self/status is the pid there (getpid() without NSpid)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return os.getpid()


def device_for(rank):
    """Item `rank` of RK_DEVICES (a comma list), or "cpu"."""
    items = [d for d in os.environ.get("RK_DEVICES", "").split(",") if d]
    return items[rank] if rank < len(items) else "cpu"


class Heartbeat:
    """The worker's end of the protocol. A None socket (no RK_HEARTBEAT) makes every call a
    no-op. When the supervisor goes (end of file or a failed send) the job goes with it:
    `lost` turns true, the worker writes no more checkpoints and stops (docs/protocol.md)."""

    def __init__(self, rank, world, device, start_step):
        self.rank = rank
        self.sock = None
        self.pending = set()
        self.buf = b""
        self.lost = False
        path = os.environ.get("RK_HEARTBEAT", "")
        self.supervised = bool(path)
        if not path:
            return
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # "@NAME" is Linux's abstract socket NAME (rk run across hosts: docs/cluster.md)
            self.sock.connect("\0" + path[1:] if path.startswith("@") else path)
        except OSError as e:
            raise SystemExit(f"heartbeat: cannot connect to the supervisor at {path} "
                             f"(RK_HEARTBEAT): {e.strerror}")
        self.send({"type": "hello", "v": 1, "rank": rank, "world": world, "pid": os.getpid(),
                   "device": device, "step": start_step})

    def _gone(self, why):
        print(f"heartbeat: the supervisor has gone ({why}); stopping without a checkpoint",
              file=sys.stderr)
        self.sock.close()
        self.sock = None
        self.lost = True

    def send(self, msg):
        if self.sock is None:
            return
        line = (json.dumps(msg, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
                + "\n").encode()
        if len(line) > LINE_MAX:
            raise ValueError(f"heartbeat line of {len(line)} bytes")
        try:
            self.sock.sendall(line)  # Python ignores SIGPIPE: a gone peer is BrokenPipeError
        except OSError as e:
            self._gone(e.strerror or str(e))

    def step(self, step, loss, dt):
        self.send({"type": "step", "rank": self.rank, "step": step,
                   "loss": loss if math.isfinite(loss) else None, "dt": dt})

    def ckpt(self, step, seconds):
        self.send({"type": "ckpt", "rank": self.rank, "step": step, "seconds": seconds})

    def event(self, step, kind, blame, action, lost_steps, detail):
        self.send({"type": "event", "rank": self.rank, "step": step, "kind": kind,
                   "blame": blame, "action": action, "lost_steps": lost_steps,
                   "detail": detail[:500]})

    def bye(self, step, status):
        self.send({"type": "bye", "rank": self.rank, "step": step, "status": status})

    def alive(self):
        """True while the supervisor is there (or there is none): reads what arrived, without
        blocking, so an end of file left by a supervisor that died is seen now. Commands stay
        pending for poll()."""
        self._read()
        return not self.lost

    def poll(self):
        """The most urgent command that arrived ("stop" > "checkpoint"), or None. Never
        blocks."""
        self._read()
        for cmd in ("stop", "checkpoint"):
            if cmd in self.pending:
                self.pending.clear()  # stop implies checkpoint
                return cmd
        return None

    def _read(self):
        while self.sock is not None:
            try:
                data = self.sock.recv(LINE_MAX, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                self._gone(e.strerror or str(e))
                break
            if not data:
                self._gone("it closed the connection")
                break
            self.buf += data
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                try:
                    cmd = json.loads(line).get("cmd")
                except (ValueError, AttributeError):
                    cmd = None
                if cmd in ("checkpoint", "stop"):
                    self.pending.add(cmd)
                else:
                    print(f"heartbeat: ignoring a line that is not a command: {line[:80]!r}",
                          file=sys.stderr)
            if len(self.buf) >= LINE_MAX:
                print("heartbeat: a command line is too long; dropped", file=sys.stderr)
                self.buf = b""


def save_state(path, state):
    """Write `state` as JSON to `path` atomically: temporary file, fsync, rename, fsync dir."""
    d = os.path.dirname(path) or "."
    os.makedirs(d, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, (json.dumps(state, separators=(",", ":")) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def load_state(path, seed):
    with open(path) as f:
        s = json.load(f)
    if s.get("format") != STATE_FORMAT or s.get("seed") != seed:
        raise ValueError(f"{path}: not a checkpoint of this worker with seed {seed}")
    version, internal, gauss_next = s["rng"]
    return s["step"], s["w"], s["b"], (version, tuple(internal), gauss_next)


def left_path(ckpt_dir, rank):
    return os.path.join(ckpt_dir, f"python_worker.rank{rank}.left")


def say_left(ckpt_dir, rank):
    """Tell the other ranks that this one has left with its checkpoint saved: an empty file
    (a rendezvous within one launch, not state: no fsync)."""
    with open(left_path(ckpt_dir, rank), "w"):
        pass


def wait_all_left(ckpt_dir, world, timeout_s, hb):
    """Wait until every rank has said it left (or timeout_s, or the supervisor goes): a rank
    that exits 4 before the others have saved their stop checkpoints would have mpirun kill
    them. True when all are there."""
    deadline = time.monotonic() + timeout_s
    while not all(os.path.exists(left_path(ckpt_dir, r)) for r in range(world)):
        if time.monotonic() >= deadline or not hb.alive():
            return False
        time.sleep(0.02)
    return True


def batch(seed, step, n):
    """The batch of `step`: the same for the same (seed, step), however the run got there."""
    g = random.Random(seed * 1000003 + step)
    xs = [g.uniform(-1.0, 1.0) for _ in range(n)]
    ys = [3.0 * x + 2.0 + g.gauss(0.0, 0.1) for x in xs]
    return xs, ys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="train until this step (default 200)")
    ap.add_argument("--ckpt-every", type=int, default=20, help="checkpoint every N steps")
    ap.add_argument("--ckpt-dir", default=os.environ.get("RK_CKPT_DIR", ""),
                    help="checkpoint directory (default $RK_CKPT_DIR; none: no checkpoints)")
    ap.add_argument("--resume", action="store_true", default=os.environ.get("RK_RESUME") == "1",
                    help="resume from the checkpoint (default: RK_RESUME=1)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--sleep", default="0.01", help="seconds per step, to watch it; a comma "
                    "list gives rank R item R (a straggler), the last item for the ranks after")
    ap.add_argument("--stop-wait", type=float, default=STOP_WAIT_S,
                    help="seconds a rank that stopped on command waits for the other ranks' "
                    f"stop checkpoints before it exits (default {STOP_WAIT_S:g})")
    ap.add_argument("--result", help="write {step, w, b} as JSON to this file at the end")
    ap.add_argument("--pid-file", help="write this process's pid, as seen from outside the "
                    "job's PID namespace, to this file at start (for a test or an operator "
                    "that signals the worker)")
    args = ap.parse_args()
    if args.pid_file:
        with open(args.pid_file + ".tmp", "w") as f:
            f.write(f"{outside_pid()}\n")
        os.replace(args.pid_file + ".tmp", args.pid_file)
    if args.steps < 0 or args.ckpt_every < 1 or args.batch < 1 or args.stop_wait < 0:
        ap.error("--steps must be >= 0, --ckpt-every and --batch >= 1, --stop-wait >= 0")
    try:
        sleeps = [float(x) for x in args.sleep.split(",")]
    except ValueError:
        ap.error(f"--sleep: {args.sleep!r} is not a number or a comma list of numbers")

    rank, world = rank_world()
    if not 0 <= rank < world:
        print(f"rank {rank} is not below world {world}", file=sys.stderr)
        return EXIT_USAGE
    sleep_s = sleeps[min(rank, len(sleeps) - 1)]
    ckpt_path = (os.path.join(args.ckpt_dir, f"python_worker.rank{rank}.json")
                 if args.ckpt_dir else "")
    if ckpt_path and world > 1:  # before hello: no stop can reach this rank before it
        try:
            os.unlink(left_path(args.ckpt_dir, rank))
        except FileNotFoundError:
            pass

    step, w, b = 0, 0.0, 0.0
    rng = random.Random(args.seed)  # the learning-rate jitter: its state is checkpointed
    if args.resume and ckpt_path and os.path.exists(ckpt_path):
        try:
            step, w, b, rng_state = load_state(ckpt_path, args.seed)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"cannot resume: {e}", file=sys.stderr)
            return EXIT_FAIL
        rng.setstate(rng_state)
        print(f"resumed from {ckpt_path} at step {step}", file=sys.stderr)
    elif args.resume:
        print("nothing to resume from: starting at step 0", file=sys.stderr)

    hb = Heartbeat(rank, world, device_for(rank), step)

    saved = [step]  # the step of the newest checkpoint (a resumed run starts on one)

    def checkpoint():
        if not ckpt_path or saved[0] == step:
            return
        if not hb.alive():  # the supervisor has gone: nothing is written after it
            return
        saved[0] = step
        t0 = time.monotonic()
        try:
            save_state(ckpt_path, {"format": STATE_FORMAT, "seed": args.seed, "step": step,
                                   "w": w, "b": b, "rng": list(rng.getstate())})
        except OSError as e:
            if e.errno not in STORAGE_ERRNOS:
                raise
            # a storage error: exit 6 (the status says it all; the event names the file)
            why = f"{e.filename or ckpt_path}: {e.strerror}"
            print(f"cannot save a checkpoint: {why}", file=sys.stderr)
            hb.event(step, "storage", -1, "exit", 0, why)
            sys.exit(EXIT_STORAGE)
        hb.ckpt(step, time.monotonic() - t0)

    while step < args.steps:
        t0 = time.monotonic()
        xs, ys = batch(args.seed, step, args.batch)
        gw = gb = loss = 0.0
        for x, y in zip(xs, ys):
            err = w * x + b - y
            loss += err * err
            gw += 2.0 * err * x
            gb += 2.0 * err
        n = float(len(xs))
        lr = args.lr * (0.9 + 0.2 * rng.random())
        w -= lr * gw / n
        b -= lr * gb / n
        step += 1
        time.sleep(sleep_s)
        hb.step(step, loss / n, time.monotonic() - t0)

        cmd = hb.poll()
        if step % args.ckpt_every == 0 or cmd is not None:
            checkpoint()
        if hb.lost:
            return EXIT_FAIL
        if cmd == "stop":
            hb.bye(step, "stopped")
            print(f"rank {rank}: stopped at step {step} on the supervisor's command"
                  + (", checkpoint saved" if ckpt_path else ""), file=sys.stderr)
            if ckpt_path and world > 1:  # none leaves before every stop checkpoint is written
                say_left(args.ckpt_dir, rank)
                if not wait_all_left(args.ckpt_dir, world, args.stop_wait, hb):
                    why = ("the supervisor has gone" if hb.lost else
                           f"not every rank said it left within {args.stop_wait:g} s (--stop-wait)")
                    print(f"rank {rank}: {why}; exiting", file=sys.stderr)
            return EXIT_STOPPED

    checkpoint()
    if ckpt_path and world > 1:  # a stopped rank does not wait for a finished one
        say_left(args.ckpt_dir, rank)
    print(f"w = {w!r}, b = {b!r} (target 3, 2)")
    print(f"final step {step} w {w!r} b {b!r}")
    if args.result:
        with open(args.result, "w") as f:
            json.dump({"step": step, "w": w, "b": b}, f)
            f.write("\n")
    hb.bye(step, "done")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
