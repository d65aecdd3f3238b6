"""The warm spare of recovery in place (docs/recovery.md, "The warm spare").

Under `rk run --recovery inplace`, rk run's keeper starts one spare process per job as
`python [OPTS] -m rekindle.torch._spare SCRIPT ARGS...` (the ranks' own command with this module
put in front of the script). The spare imports torch, rekindle.torch and the script's top-level
imports, then waits on the descriptor named by RK_SPARE_FD. When a rank dies, the keeper writes
that rank's RANK, LOCAL_RANK and the new rendezvous's variables there (NAME=VALUE, each NUL-ended)
and closes it; the spare sets them and runs SCRIPT as `__main__`, as `python SCRIPT ARGS` would
have: the replacement does not start Python and import torch while the survivors wait. End of
file with nothing written (the job ended): the spare exits 0, having run nothing.
"""

import ast
import importlib
import importlib.util
import os
import runpy
import stat
import sys
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


def _warm(script):
    import torch  # noqa: F401  (the point: imported before a rank is needed)
    import torch.distributed  # noqa: F401

    import rekindle.torch  # noqa: F401

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


def main():
    fd_s = os.environ.pop("RK_SPARE_FD", "")
    if not fd_s.isdigit() or len(sys.argv) < 2:
        sys.stderr.write("rekindle: warm spare: started without RK_SPARE_FD or a script; "
                         "rk run's keeper starts it (docs/recovery.md)\n")
        return 2
    script, args = sys.argv[1], sys.argv[2:]
    _warm(script)
    warm_s = _age()
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
    os.environ.update(env)
    if env.get("RANK", "0") != "0" and os.environ.get("MASTER_PORT"):
        # rank 0 (a survivor) makes the new rendezvous's store while this spare, warm, is
        # already here: the script's init_process_group would find it refused and retry only
        # a second later (docs/recovery.md "The warm spare")
        from rekindle.torch._inplace import await_store

        await_store(os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ["MASTER_PORT"])
    worker.trace_phase("spare.rank")  # RK_TRACE_LAUNCH: the rank is this spare's from here
    sys.stderr.write("rekindle: warm spare (pid %d, warmed in %.2f s) is rank %s\n"
                     % (_host_pid(), warm_s, env.get("RANK", "?")))
    sys.stderr.flush()
    sys.argv = [script] + args
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(os.path.abspath(script), run_name="__main__")  # __file__ absolute, as python's
    return 0


if __name__ == "__main__":
    sys.exit(main())
