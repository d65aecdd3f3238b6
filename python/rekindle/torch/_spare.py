"""The warm spare of recovery in place (docs/recovery.md, "The warm spare").

Under `rk run --recovery inplace`, rk run's keeper starts one spare process per job as
`python [OPTS] -m rekindle.torch._spare SCRIPT ARGS...` (the ranks' own command with this module
put in front of the script). The spare imports torch, rekindle.torch and the script's top-level
imports, then runs SCRIPT as `__main__` ahead of its rank, as `python SCRIPT ARGS` would, until the
script first asks for what only a rank has (`_Ahead`: a read of RANK, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT or a variable of the replacement's order, the environment iterated, `init_process_group`), with its output
held back. When a rank dies, the keeper writes that rank's RANK, LOCAL_RANK and the new
rendezvous's variables on the descriptor named by RK_SPARE_FD (NAME=VALUE, each NUL-ended) and
closes it; the spare sets them, lets the held output out and the script go on: the replacement
does not start Python, import torch or run the script's rank-free set-up (its data, say) while
the survivors wait. End of file with nothing written (the job ended): the spare exits 0, its
held output dropped. RK_SPARE_AHEAD=0: the script waits for the rank before it starts.
"""

import ast
import importlib
import importlib.util
import os
import runpy
import stat
import sys
import threading
import time

# An assignment is at most the keeper's buffer (launch.c, assign_spare): a longer one is refused.
_MAX = 12288


def _script_imports(script):
    """The top-level modules SCRIPT imports at its top level that live outside its own
    directory (its own modules could act on the environment, which is not the rank's yet)."""
    try:
        # a regular file only (a FIFO would block the spare before it ever waits for a rank),
        # its first MiB: what is cut off is not pre-imported, the script still runs whole
        fd = os.open(script, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return []
            tree = ast.parse(f.read(1 << 20), script)
    except (OSError, SyntaxError, ValueError):
        return []
    here = os.path.realpath(os.path.dirname(os.path.abspath(script)))
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    out = []
    for n in dict.fromkeys(names):
        try:
            spec = importlib.util.find_spec(n)
        except (ImportError, ValueError):
            continue
        origin = spec.origin if spec else None
        if not origin or origin in ("built-in", "frozen"):
            if spec:
                out.append(n)
            continue
        if not os.path.realpath(origin).startswith(here + os.sep):
            out.append(n)
    return out


def _warm():
    import torch  # noqa: F401  (the point: imported before a rank is needed)
    import torch.distributed  # noqa: F401

    import rekindle.torch  # noqa: F401


def _warm_script(script):
    for n in _script_imports(script):
        try:
            importlib.import_module(n)
        except Exception:  # noqa: BLE001 - the script's own import will say what is wrong
            pass


def _read_assignment(fd):
    buf = b""
    while True:
        b = os.read(fd, 4096)
        if not b:
            break
        buf += b
        if len(buf) > _MAX:
            raise ValueError("rekindle: warm spare: an assignment over %d bytes" % _MAX)
    os.close(fd)
    env = {}
    for item in buf.split(b"\0"):
        if not item:
            continue
        name, eq, value = item.partition(b"=")
        if not eq or not name:
            raise ValueError("rekindle: warm spare: not NAME=VALUE: %r" % item[:64])
        env[os.fsdecode(name)] = os.fsdecode(value)
    return env


def _age():
    """Seconds since this process started (the kernel's start time: the imports Python did
    before main, torch's included, are counted), or -1 if unknown."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read(4096)
        start = int(stat[stat.rindex(b")") + 2:].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return -1.0


def _host_pid():
    """This process's pid as the host sees it (the first NSpid of /proc/self/status: the
    ranks run in a PID namespace of their own, where os.getpid() is small), else os.getpid()."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f.read(65536).splitlines():
                if line.startswith(b"NSpid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return os.getpid()


# What only a rank has: the script run ahead stops at its first read of one of these (or of
# the whole environment). A rank's environment is the spare's (the launch's: WORLD_SIZE, the
# RK_ variables of the job) with RANK and LOCAL_RANK and the assignment's variables, which
# launch.c (assign_spare) and inplace.c (the replacement's order) write; the usual names of a
# rank's place that rk run does not set are here too, should a script read them.
_RANK_NAMES = frozenset(("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "NODE_RANK", "MASTER_ADDR",
                         "MASTER_PORT", "RK_REJOIN_EPOCH", "RK_INJECT_DONE"))


def _rank_name(key):
    if isinstance(key, bytes):
        key = os.fsdecode(key)
    return key in _RANK_NAMES


class _Gated(type(os.environ)):
    """os.environ (or os.environb) while the script runs ahead of its rank: the same variables
    (one dict, one process environment), but a read of a rank's variable, or a look at the
    whole environment, waits for the rank (_Ahead.wait)."""

    def __init__(self, ahead, env):
        super().__init__(env._data, env.encodekey, env.decodekey, env.encodevalue, env.decodevalue)
        self._ahead = ahead

    def __getitem__(self, key):
        if _rank_name(key):
            self._ahead.wait(key)
        return super().__getitem__(key)

    def __iter__(self):
        self._ahead.wait(None)
        return super().__iter__()

    def __len__(self):
        self._ahead.wait(None)
        return super().__len__()


class _Ahead:
    """The script run ahead of its rank (docs/recovery.md, "The warm spare"). Until the rank
    comes, `_Gated` environments stand for os.environ and os.environb, init_process_group
    waits, and the script's standard output and error (the descriptors: what torch's C++ says
    too) go to memory files. A thread reads the assignment: end of file with nothing written
    (the job ended) exits 0, the held output dropped; a bad one exits 2, saying what is wrong.
    The first thread at a gate once the rank came (or the script's end) sets the rank's
    variables, puts everything back and lets the held output out, after the spare's line."""

    def __init__(self, fd):
        self.fd, self.warm_s = fd, None
        self.came = threading.Event()
        self.lock = threading.RLock()
        self.inside = threading.local()  # this thread is in wait(): its own reads pass
        self.env = None
        self.open = False
        self.t0 = time.monotonic()  # the script's start (warmed)
        self.stopped = None  # (what the script waited at first, seconds it ran ahead)
        self.held = {}  # descriptor -> (the real one, dup'ed; the memory file)
        self.init = []  # (module, torch's init_process_group) replaced

    def start(self):
        for f in (sys.stdout, sys.stderr):
            _flush(f)
        for fd in (1, 2):
            mem = os.memfd_create("rk-spare-held-%d" % fd, os.MFD_CLOEXEC)
            self.held[fd] = (os.dup(fd), mem)  # os.dup: close-on-exec
            os.dup2(mem, fd)
        self.environ = os.environ, os.environb
        os.environ, os.environb = _Gated(self, os.environ), _Gated(self, os.environb)
        try:
            import torch.distributed as dist
            import torch.distributed.distributed_c10d as c10d
        except ImportError:
            dist = c10d = None
        for m in (dist, c10d):
            orig = getattr(m, "init_process_group", None)
            if orig is not None:
                self.init.append((m, orig))
                m.init_process_group = self._gated_init(orig)
        os.register_at_fork(after_in_child=self._forked)
        threading.Thread(target=self._orders, name="rk-spare-orders", daemon=True).start()

    def _forked(self):
        """A process the script forked before its rank came (no thread to read the rank in it):
        the launch's environment, not waited on, and the real output."""
        if self.open:
            return
        self.open = True
        os.environ, os.environb = self.environ
        for m, orig in self.init:
            m.init_process_group = orig
        for fd, (real, mem) in self.held.items():
            os.dup2(real, fd)
            os.close(real)
            os.close(mem)

    def _trace(self, phase):
        from rekindle import worker

        on, self.inside.on = getattr(self.inside, "on", False), True
        try:
            worker.trace_phase(phase)  # it reads RANK: passed, not waited for
        finally:
            self.inside.on = on

    def warmed(self, warm_s):
        """The imports are done (warm_s since the process started): the script runs from here."""
        self.warm_s, self.t0 = warm_s, time.monotonic()
        self._trace("spare.warm")  # RK_TRACE_LAUNCH: imports done, the script runs ahead

    def _gated_init(self, orig):
        def init_process_group(*args, **kwargs):
            self.wait("init_process_group")
            return orig(*args, **kwargs)
        init_process_group.__doc__, init_process_group.__wrapped__ = orig.__doc__, orig
        return init_process_group

    def _orders(self):
        try:
            env = _read_assignment(self.fd)
        except (ValueError, OSError) as e:
            msg = str(e) if isinstance(e, ValueError) else "rekindle: warm spare: reading RK_SPARE_FD %d: %s" % (self.fd, e)
            os.write(self.held[2][0], (msg + "\n").encode(errors="replace"))
            os._exit(2)
        if not env:
            os._exit(0)  # the job ended: no rank for this spare, nothing of the script said
        self.env = env
        self.came.set()

    def wait(self, what):
        """Returns once the rank is this process's; what: the variable read (None: the whole
        environment), "init_process_group" or "" (the script's end)."""
        if self.open or getattr(self.inside, "on", False):
            return
        with self.lock:
            if self.open:
                return
            self.inside.on = True
            try:
                if self.stopped is None:
                    self.stopped = (what, time.monotonic() - self.t0)
                    self._trace("spare.ahead")  # RK_TRACE_LAUNCH: the script waits for its rank
                self.came.wait()
                self._release()
            finally:
                self.inside.on = False

    def _release(self):
        os.environ, os.environb = self.environ
        for m, orig in self.init:
            m.init_process_group = orig
        self.open = True
        for f in (sys.stdout, sys.stderr):
            _flush(f)
        for fd, (real, _) in self.held.items():
            os.dup2(real, fd)
            os.close(real)
        what, ran_s = self.stopped
        if self.warm_s is None:  # a module the script imports asked for the rank
            self.warm_s, ran_s = _age(), 0.0
        where = ("its end" if what == "" else "its init_process_group" if what == "init_process_group"
                 else "its look at the whole environment" if what is None else "its read of %s" % what)
        _become(self.env, self.warm_s, ", the script run %.2f s ahead to %s" % (ran_s, where))
        for fd, (_, mem) in self.held.items():
            os.lseek(mem, 0, os.SEEK_SET)
            while True:
                b = os.read(mem, 1 << 16)
                if not b:
                    break
                _write_all(fd, b)
            os.close(mem)


def _flush(f):
    try:
        if f is not None:
            f.flush()
    except (OSError, ValueError):
        pass


def _write_all(fd, b):
    view = memoryview(b)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue
        except OSError:
            return  # the rank's standard output gone: what was held is lost with it


def _become(env, warm_s, ahead):
    """Take the rank: its variables set, rank 0's new store awaited, the spare's line said."""
    os.environ.update(env)
    if env.get("RANK", "0") != "0" and os.environ.get("MASTER_PORT"):
        # rank 0 (a survivor) makes the new rendezvous's store while this spare, warm, is
        # already here: the script's init_process_group would find it refused and retry only
        # a second later (docs/recovery.md "The warm spare")
        from rekindle.torch._inplace import await_store

        await_store(os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ["MASTER_PORT"])
    from rekindle import worker

    worker.trace_phase("spare.rank")  # RK_TRACE_LAUNCH: the rank is this spare's from here
    sys.stderr.write("rekindle: warm spare (pid %d, warmed in %.2f s%s) is rank %s\n"
                     % (_host_pid(), warm_s, ahead, env.get("RANK", "?")))
    sys.stderr.flush()


def main():
    fd_s = os.environ.pop("RK_SPARE_FD", "")
    if not fd_s.isdigit() or len(sys.argv) < 2:
        sys.stderr.write("rekindle: warm spare: started without RK_SPARE_FD or a script; "
                         "rk run's keeper starts it (docs/recovery.md)\n")
        return 2
    script, args = sys.argv[1], sys.argv[2:]
    _warm()
    ahead = None
    if os.environ.get("RK_SPARE_AHEAD", "1") != "0":
        # from here a module that reads the rank's variables waits for them, what is said is held
        ahead = _Ahead(int(fd_s))
        ahead.start()
    _warm_script(script)
    warm_s = _age()
    sys.argv = [script] + args
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    path = os.path.abspath(script)  # __file__ absolute, as python's
    if ahead is None:  # RK_SPARE_AHEAD=0: the script waits for the rank to start
        from rekindle import worker

        worker.trace_phase("spare.warm")  # RK_TRACE_LAUNCH: imports done, waiting for a rank
        try:
            env = _read_assignment(int(fd_s))
        except ValueError as e:
            sys.stderr.write("%s\n" % e)
            return 2
        except OSError as e:
            sys.stderr.write("rekindle: warm spare: reading RK_SPARE_FD %s: %s\n" % (fd_s, e))
            return 2
        if not env:
            return 0  # the job ended: no rank for this spare
        _become(env, warm_s, "")
        runpy.run_path(path, run_name="__main__")
        return 0
    ahead.warmed(warm_s)
    try:
        runpy.run_path(path, run_name="__main__")
    finally:  # a script that never asked for its rank (or failed first) still waits for it
        ahead.wait("")
    return 0


if __name__ == "__main__":
    sys.exit(main())
