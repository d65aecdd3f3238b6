"""The worker's end of rekindle's heartbeat protocol (docs/protocol.md), in the standard library.

Under `rk run` (RK_HEARTBEAT set) a Worker connects to the supervisor's Unix socket when it says
hello and keeps that one connection; it sends newline-delimited JSON (hello, comm, step, event,
ckpt, inject, bye, save) and reads the supervisor's commands (stop, checkpoint) without blocking.
Without RK_HEARTBEAT every call is a no-op: the same script runs standalone.

The rules are the C client's (src/runtime/heartbeat.c): lines of at most 4096 bytes, integers
as JSON integers, a non-finite loss as null, an event's detail cleaned (control characters and
bytes that are not UTF-8 become '?') and cut to 512 bytes on a character boundary, sends that
never raise SIGPIPE, one line at a time across threads. When the supervisor has gone (end of
file, a failed send) the worker is `lost`: it must write no more checkpoints and stop with a
non-zero status (docs/protocol.md, "When the supervisor goes").
"""

import errno
import json
import math
import operator
import os
import re
import socket
import sys
import threading
import time

EXIT_OK = 0  # finished; said bye "done"
EXIT_FAIL = 1  # an error of the job or an unexpected one: relaunch
EXIT_USAGE = 2  # bad usage or bad input: relaunching will not help
EXIT_COMM = 3  # a peer rank or the link died: relaunch
EXIT_STOPPED = 4  # stopped on command with a checkpoint saved; said bye "stopped"
EXIT_GUARD = 5  # a guard tripped and could not recover in-process: relaunch
EXIT_STORAGE = 6  # storage refused a file the job needs: stop

# The errnos that make a checkpoint failure a storage failure (exit 6), as the C store's.
STORAGE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}
)

LINE_MAX = 4096  # bytes per line, newline included
DETAIL_MAX = 512  # bytes of an event's detail
DEVICE_MAX = 63  # bytes of hello's device
RESTORES = ("memory", "peer", "disk", "none")  # hello's optional restore
STEP_MAX = 1 << 53  # highest step and lost_steps
RANK_MAX = 65535
WORLD_MAX = 65536
COMMANDS = ("stop", "checkpoint", "rejoin")
REJOIN_EPOCH_MAX = (1 << 31) - 1  # rejoin's "epoch": 1 .. this
PORT_MAX = 65535  # rejoin's "port": 1 .. this
_WORD = re.compile(r"[a-z_]{1,31}\Z")
_BAD_MSGS = 3  # bad command lines reported per connection, then a count


_trace = [None, None]  # RK_TRACE_LAUNCH: [descriptor or -1 (off), the pid that opened it]


def trace_phase(phase):
    """RK_TRACE_LAUNCH=FILE (an absolute path): append "PHASE T PID LAUNCH RANK" to FILE, T the
    CLOCK_MONOTONIC time (the C side's format and clock: src/base/phase.h, docs/run.md); LAUNCH
    and RANK from RK_LAUNCH and RANK, -1 where unset. One os.write to an O_APPEND descriptor; off
    (one lookup) without the variable; best effort: a file that cannot be written is left out."""
    if _trace[0] is None or (_trace[0] >= 0 and _trace[1] != os.getpid()):
        path = os.environ.get("RK_TRACE_LAUNCH", "")
        fd = -1
        if path.startswith("/"):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError:
                fd = -1
        _trace[0], _trace[1] = fd, os.getpid()
    if _trace[0] < 0:
        return
    def num(name):
        v = os.environ.get(name, "")
        return int(v) if v.isdigit() and len(v) < 10 else -1
    line = "%s %.9f %d %d %d\n" % (phase, time.monotonic(), os.getpid(), num("RK_LAUNCH"), num("RANK"))
    try:
        os.write(_trace[0], line.encode())
    except OSError:
        pass


trace_phase("py.import")  # the interpreter and what the script imported before rekindle


def _env_int(env, name, lo, hi):
    text = env.get(name, "")
    if not re.fullmatch(r"[0-9]{1,19}", text) or not lo <= int(text) <= hi:
        raise ValueError(f"{name}={text[:40]!r} is not an integer in {lo}..{hi}")
    return int(text)


def rank_world(env=None):
    """(rank, world) from the launcher: RANK/WORLD_SIZE (rk run, torchrun), else
    OMPI_COMM_WORLD_RANK/SIZE (Open MPI), PMI_RANK/SIZE (MPICH, Hydra), SLURM_PROCID/NTASKS
    (Slurm); the first pair present. (0, 1) without any. ValueError for a malformed one."""
    env = os.environ if env is None else env
    for r, w in (
        ("RANK", "WORLD_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
    ):
        if env.get(r) and env.get(w):
            world = _env_int(env, w, 1, WORLD_MAX)
            rank = _env_int(env, r, 0, RANK_MAX)
            if rank >= world:
                raise ValueError(f"{r}={rank} is not below {w}={world}")
            return rank, world
    return 0, 1


def local_rank_of(rank, env=None):
    """The rank on this node: LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
    SLURM_LOCALID, else `rank` (one node)."""
    env = os.environ if env is None else env
    for name in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"):
        if env.get(name):
            return _env_int(env, name, 0, RANK_MAX)
    return rank


def ckpt_env(env=None):
    """What rk run asks of this process's checkpoints, read from the environment in this one
    place (rk_worker_ckpt_env in C): (the directory, RK_CKPT_DIR, None when unset or empty;
    resume, True only when RK_RESUME is "1")."""
    env = os.environ if env is None else env
    return env.get("RK_CKPT_DIR") or None, env.get("RK_RESUME") == "1"


def outside_pid():
    """This process's pid as seen from outside the job's PID namespace (rk run starts a job in
    one of its own): the first NSpid of /proc/self/status, getpid() without NSpid. For pid
    files a test or an operator signals; the hello carries getpid(), as the protocol says."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return os.getpid()


def _qmark(err):
    return ("?" * (err.end - err.start), err.end)


def clean_text(text, limit=DETAIL_MAX):
    """`text` (str or bytes) as the C client sends a detail: control characters (U+0000..U+001F,
    U+007F..U+009F), lone surrogates and bytes that are not UTF-8 become '?', then it is cut to
    `limit` bytes of UTF-8 on a character boundary."""
    if text is None:
        return ""
    if isinstance(text, (bytes, bytearray, memoryview)):
        out = []
        raw = bytes(text)
        i = 0
        while i < len(raw):  # bytes that are not UTF-8: one '?' each
            try:
                out.append(raw[i:].decode("utf-8"))
                break
            except UnicodeDecodeError as e:
                out.append(raw[i : i + e.start].decode("utf-8"))
                out.append("?" * (e.end - e.start))
                i += e.end
        text = "".join(out)
    else:
        text = str(text)
    chars = []
    size = 0
    for ch in text:
        c = ord(ch)
        if c < 0x20 or 0x7F <= c <= 0x9F or 0xD800 <= c <= 0xDFFF:
            ch = "?"
        n = len(ch.encode("utf-8"))
        if size + n > limit:
            break
        chars.append(ch)
        size += n
    return "".join(chars)


def _int(name, v, lo, hi):
    if isinstance(v, bool):
        raise ValueError(f"heartbeat: {name} must be an integer, not a bool")
    try:
        v = operator.index(v)
    except TypeError:
        raise ValueError(f"heartbeat: {name} must be an integer, not {type(v).__name__}") from None
    if not lo <= v <= hi:
        raise ValueError(f"heartbeat: {name} {v} is not in {lo}..{hi}")
    return int(v)


def _nonneg(name, v):
    if isinstance(v, bool):
        raise ValueError(f"heartbeat: {name} must be a number")
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"heartbeat: {name} must be a number, not {type(v).__name__}") from None
    if not (math.isfinite(x) and x >= 0):
        raise ValueError(f"heartbeat: {name} {x!r} is not a finite number >= 0")
    return x


def _word(name, v):
    if not isinstance(v, str) or not _WORD.match(v):
        raise ValueError(f"heartbeat: {name} {v!r} is not a word of 1 to 31 characters a-z or _")
    return v


def _check_string(name, v, limit):
    if not isinstance(v, str):
        raise ValueError(f"heartbeat: {name} must be a string")
    if clean_text(v, limit) != v:
        raise ValueError(
            f"heartbeat: {name} {v[:40]!r} is not a string of at most {limit} bytes of UTF-8 "
            "without control characters"
        )
    return v


def format_line(msg):
    """One protocol line (bytes, newline included) for a dict of already checked fields, in
    their order. Integers stay integers, floats are written as the shortest text that reads
    back exactly, None is null. ValueError for a line over 4096 bytes."""
    line = (
        json.dumps(msg, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"
    ).encode("utf-8")
    if len(line) > LINE_MAX:
        raise ValueError(f"heartbeat: the line is {len(line)} bytes, more than {LINE_MAX}")
    return line


def parse_command(line):
    """The command of one line from the supervisor (bytes without its newline): "stop",
    "checkpoint" or "rejoin". ValueError naming what is wrong otherwise (not JSON, not an
    object, a key twice, no "cmd", an unknown command, a rejoin without its epoch and port).
    Other fields are ignored."""
    return parse_command_args(line)[0]


def parse_command_args(line):
    """parse_command's command and its arguments: (cmd, {}) for "stop" and "checkpoint",
    ("rejoin", {"epoch": E, "port": P}) for a rejoin (docs/protocol.md: E a whole number 1 ..
    2^31-1, P a TCP port 1 .. 65535; anything else is a ValueError naming the field)."""
    if len(line) + 1 > LINE_MAX:
        raise ValueError(f"heartbeat command: the line is {len(line) + 1} bytes, more than {LINE_MAX}")
    if line.endswith(b"\r"):
        line = line[:-1]

    def pairs(kv):
        seen = set()
        for k, _ in kv:
            if k in seen:
                raise ValueError(f"heartbeat command: key {clean_text(k, 64)!r} appears twice")
            seen.add(k)
        return dict(kv)

    def constant(name):
        raise ValueError(f"heartbeat command: not JSON: {name}")

    try:
        obj = json.loads(line.decode("utf-8"), object_pairs_hook=pairs, parse_constant=constant)
    except UnicodeDecodeError:
        raise ValueError("heartbeat command: not valid UTF-8") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"heartbeat command: not JSON: {e.msg} (byte {e.pos})") from None
    except RecursionError:
        raise ValueError("heartbeat command: not JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise ValueError("heartbeat command: not a JSON object")
    cmd = obj.get("cmd")
    if cmd is None:
        raise ValueError('heartbeat command: field "cmd": missing')
    if not isinstance(cmd, str):
        raise ValueError('heartbeat command: field "cmd": expected a string')
    if cmd not in COMMANDS:
        raise ValueError(f'heartbeat command: field "cmd": unknown command "{clean_text(cmd, 64)}"')
    if cmd != "rejoin":
        return cmd, {}
    args = {}
    for name, top in (("epoch", REJOIN_EPOCH_MAX), ("port", PORT_MAX)):
        v = obj.get(name)
        if v is None:
            raise ValueError(f'heartbeat command: rejoin: field "{name}": missing')
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top:
            raise ValueError(f'heartbeat command: rejoin: field "{name}": expected a whole number 1 .. {top}')
        args[name] = v
    return cmd, args


class Worker:
    """One rank's connection to `rk run` (see the module's comment and docs/python.md).

    Attributes: rank, world, local_rank, launch (ints), device (str), ckpt_dir (str or None),
    resume (bool), supervised (bool: RK_HEARTBEAT set and not lost), lost (bool: the supervisor
    has gone), error (the last problem as text, or None), heartbeat (the socket path or None).
    """

    def __init__(self, device=None, *, env=None, install_stacks=True):
        env = os.environ if env is None else env
        self.rank, self.world = rank_world(env)
        self.local_rank = local_rank_of(self.rank, env)
        launch = env.get("RK_LAUNCH", "")
        self.launch = _env_int(env, "RK_LAUNCH", 0, (1 << 62)) if launch else 0
        if device is None:
            items = [d for d in env.get("RK_DEVICES", "").split(",") if d]
            device = items[self.rank] if self.rank < len(items) else "cpu"
        self.device = str(device)
        self.ckpt_dir, self.resume = ckpt_env(env)
        self.heartbeat = env.get("RK_HEARTBEAT") or None
        self.lost = False
        self.error = None
        self.stacks_path = None
        self._sock = None
        self._pid = None  # the process that connected (a forked child sends nothing)
        self._lock = threading.Lock()
        self._pending = set()
        self.rejoin = None  # the newest rejoin command's arguments ({"epoch", "port"}), or None
        self._buf = b""
        self._skip_line = False  # inside a command line that was too long
        self._bad_lines = 0
        self._said_hello = False
        self._said_step = False  # a step was said (the trace's first step)
        if install_stacks and env.get("RK_STACK_DIR"):
            from . import stacks

            try:
                self.stacks_path = stacks.install(env=env, rank=self.rank, launch=self.launch)
            except OSError as e:
                print(f"rekindle: cannot set up stack dumps: {e}", file=sys.stderr)

    # ---- state -------------------------------------------------------------------------

    @property
    def supervised(self):
        """True under a supervisor (RK_HEARTBEAT set) that has not gone: before hello, and
        after it while connected."""
        return self.heartbeat is not None and not self.lost

    def _mine(self):
        return self._sock is not None and self._pid == os.getpid()

    def _gone(self, why):
        """The supervisor has gone: close, say so once, turn lost. Lock held."""
        self.error = f"heartbeat: the supervisor at {self.heartbeat} (RK_HEARTBEAT) has gone ({why})"
        print(f"rekindle: {self.error}; stop without writing another checkpoint", file=sys.stderr)
        try:
            self._sock.close()
        except OSError:
            pass
        self._sock = None
        self.lost = True

    # ---- sending -----------------------------------------------------------------------

    def _send(self, msg):
        self._send_line(format_line(msg))

    def _send_line(self, line):
        with self._lock:
            if not self._mine():
                return
            try:
                self._sock.sendall(line, socket.MSG_NOSIGNAL)
            except OSError as e:
                self._gone(e.strerror or str(e))
            except BaseException:
                # a signal handler raised (KeyboardInterrupt) inside the send: part of the
                # line may be out, and the next one would run into it; the connection is done
                self._gone("a send was interrupted by an exception")
                raise

    def hello(self, step=0, restore=None, rejoin=False):
        """Connect (when RK_HEARTBEAT is set) and say hello from `step` (0, or the step of the
        checkpoint resumed from). `restore`, optional: where that state came from, "memory",
        "peer" (recovery in place: a rank kept sent it), "disk" or "none" (docs/protocol.md; None:
        not said). `rejoin`: the rank can leave its
        process group and join a new one on a rejoin command (recovery in place). A supervisor that cannot be
        reached makes the worker lost (alive() is False): the job went with it. Once only."""
        if restore is not None and restore not in RESTORES:
            raise ValueError(f"hello: restore {restore!r} is not one of {', '.join(RESTORES)}")
        if self._said_hello or not self.heartbeat or self.lost:
            return
        step = _int("step", step, 0, STEP_MAX)
        device = _check_string("device", self.device, DEVICE_MAX)
        self._said_hello = True
        path = self.heartbeat
        if len(os.fsencode(path)) > 107:
            with self._lock:
                self.lost = True
                self.error = f"heartbeat: RK_HEARTBEAT path is over 107 bytes: {path[:120]}"
            print(f"rekindle: {self.error}", file=sys.stderr)
            return
        trace_phase("worker.hello")  # before the hello: rk run cannot act on it first
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            # "@name": an abstract socket (a multi-host job's agent, docs/cluster.md)
            s.connect("\0" + path[1:] if path.startswith("@") else path)
        except OSError as e:
            s.close()
            with self._lock:
                self.lost = True
                self.error = (
                    f"heartbeat: cannot connect to the supervisor at {path} (RK_HEARTBEAT): "
                    f"{e.strerror or e}"
                )
            print(f"rekindle: {self.error}", file=sys.stderr)
            return
        with self._lock:
            self._sock = s
            self._pid = os.getpid()
        msg = {"type": "hello", "v": 1, "rank": self.rank, "world": self.world, "pid": os.getpid(),
               "device": device, "step": step}
        from . import stacks

        if self.stacks_path is not None or stacks.installed() is not None:
            msg["stacks"] = True
        if restore is not None:
            msg["restore"] = restore
        if rejoin:  # this rank can rejoin a new process group in place (docs/protocol.md)
            msg["rejoin"] = True
        self._send(msg)

    def comm(self, step):
        """About to enter the gradient collective; `step` = steps applied before it."""
        if self._mine():  # once a step: formatted directly (what format_line would write)
            self._send_line(b'{"type":"comm","rank":%d,"step":%d}\n' % (self.rank, _int("step", step, 0, STEP_MAX)))

    def step(self, step, loss, dt):
        """Step `step` was applied (this one included): its loss (None, NaN or an infinity is
        sent as null) and the seconds it took (>= 0)."""
        if not self._mine():
            return
        step = _int("step", step, 0, STEP_MAX)
        if loss is not None:
            if isinstance(loss, bool):
                raise ValueError("heartbeat: loss must be a number")
            loss = float(loss)
            if not math.isfinite(loss):
                loss = None
        if not self._said_step:  # the first step, about to be said (before rk run can act on it)
            self._said_step = True
            trace_phase("worker.step")
        # once a step: formatted directly, as format_line would (a float's repr is its JSON)
        self._send_line(b'{"type":"step","rank":%d,"step":%d,"loss":%s,"dt":%s}\n' % (
            self.rank, step, b"null" if loss is None else repr(loss).encode(), repr(_nonneg("dt", dt)).encode()))

    def event(self, step, kind, blame=-1, action="none", lost_steps=0, detail=""):
        """A guard tripped or something is suspicious. kind and action are words [a-z_]{1,31};
        blame the rank held responsible (-1 unknown); detail is cleaned, never refused."""
        if not self._mine():
            return
        self._send({"type": "event", "rank": self.rank, "step": _int("step", step, 0, STEP_MAX),
                    "kind": _word("kind", kind), "blame": _int("blame", blame, -1, RANK_MAX),
                    "action": _word("action", action),
                    "lost_steps": _int("lost_steps", lost_steps, 0, STEP_MAX),
                    "detail": clean_text(detail)})

    def exit_event(self, step, kind, detail="", blame=-1):
        """The event before exiting with a failure: action "exit", kind usage, commfail,
        guard_failed or storage (for exit statuses 2, 3, 5, 6), or exception (an error in the
        job's own code, exit status 1: counted against no device, docs/protocol.md)."""
        self.event(step, kind, blame=blame, action="exit", lost_steps=0, detail=detail)

    def ckpt(self, step, seconds):
        """The checkpoint of `step` is durable (after the rename, never before)."""
        if self._mine():
            self._send({"type": "ckpt", "rank": self.rank, "step": _int("step", step, 0, STEP_MAX),
                        "seconds": _nonneg("seconds", seconds)})

    def save(self, step, keep):
        """Rank 0 under RK_CKPT_FROM_SNAP=1: every rank has put and pinned its snapshot of
        `step`; rk run is to write the checkpoint of `step` from them, keeping `keep`."""
        if self._mine():
            self._send({"type": "save", "rank": self.rank, "step": _int("step", step, 0, STEP_MAX),
                        "keep": _int("keep", keep, 1, 1000)})

    def inject(self, step, index, kind):
        """Injected fault `index` of RK_INJECT is about to fire (sent before it fires)."""
        if self._mine():
            self._send({"type": "inject", "rank": self.rank,
                        "step": _int("step", step, 0, STEP_MAX),
                        "index": _int("index", index, 0, (1 << 31) - 1),
                        "kind": _word("kind", kind)})

    def bye(self, step, status):
        """Leaving: status "done" (exit 0) or "stopped" (stopped on command, exit 4)."""
        if status not in ("done", "stopped"):
            raise ValueError(f"heartbeat: bye status {status!r} is not 'done' or 'stopped'")
        if self._mine():
            self._send({"type": "bye", "rank": self.rank, "step": _int("step", step, 0, STEP_MAX),
                        "status": status})

    # ---- receiving ---------------------------------------------------------------------

    def _bad(self, why):
        """A line that is not a command. Lock held."""
        self._bad_lines += 1
        self.error = why
        if self._bad_lines <= _BAD_MSGS:
            print(f"rekindle: {why}; line ignored", file=sys.stderr)
        elif self._bad_lines == _BAD_MSGS + 1:
            print("rekindle: more bad command lines; not reported one by one", file=sys.stderr)

    def _take_lines(self, data):
        self._buf += data
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) >= LINE_MAX and not self._skip_line:
                    self._bad(f"heartbeat command: a line of more than {LINE_MAX} bytes")
                    self._skip_line = True
                if self._skip_line:
                    self._buf = b""
                return
            line, self._buf = self._buf[:nl], self._buf[nl + 1 :]
            if self._skip_line:  # the end of a line already refused
                self._skip_line = False
                continue
            try:
                cmd, args = parse_command_args(line)
                self._pending.add(cmd)
                if cmd == "rejoin" and (self.rejoin is None or args["epoch"] > self.rejoin["epoch"]):
                    self.rejoin = args
            except ValueError as e:
                self._bad(str(e))

    def _read(self):
        """Read what arrived without blocking; end of file turns the worker lost. Lock held."""
        while self._mine():
            try:
                data = self._sock.recv(LINE_MAX, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._gone(e.strerror or str(e))
                return
            if not data:
                self._gone("it closed the connection")
                return
            self._take_lines(data)

    def poll(self):
        """The commands received since the last poll, as a set ("stop", "checkpoint"); never
        blocks. Lines that are not commands are reported on stderr and skipped."""
        with self._lock:
            self._read()
            cmds, self._pending = self._pending, set()
        return cmds

    def alive(self):
        """False once the supervisor has gone: then write no checkpoint, and stop. Reads for
        end of file without blocking; commands read stay for poll(). True unsupervised."""
        with self._lock:
            self._read()
        return not self.lost

    def close(self):
        """Close the connection (exiting does too)."""
        with self._lock:
            if self._sock is not None and self._pid == os.getpid():
                self._sock.close()
            self._sock = None

    def __repr__(self):
        state = "lost" if self.lost else "supervised" if self.supervised else "standalone"
        return (f"<rekindle.Worker rank {self.rank}/{self.world} device {self.device!r} "
                f"launch {self.launch} {state}>")
