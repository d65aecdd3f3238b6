"""Stack dumps on SIGUSR1 (docs/python.md): `rk run` sends SIGUSR1 to a hung rank whose hello
said "stacks": true, waits for the file to stop growing and copies it into its log before it
kills the rank. faulthandler writes every thread's Python stack from the signal handler itself,
so it works while the main thread is stuck in a collective or a C call holding the GIL released.
"""

import errno
import faulthandler
import os
import signal
import stat

_installed = None  # (path, file object): kept open for the handler, for the process's life


def default_path(env=None, rank=None, launch=None):
    """$RK_STACK_DIR/stacks-rank<RANK>-launch<RK_LAUNCH>.txt, or None without RK_STACK_DIR."""
    env = os.environ if env is None else env
    d = env.get("RK_STACK_DIR")
    if not d:
        return None
    if rank is None:
        from .worker import rank_world

        rank = rank_world(env)[0]
    if launch is None:
        launch = int(env.get("RK_LAUNCH") or 0)
    return os.path.join(d, f"stacks-rank{int(rank)}-launch{int(launch)}.txt")


def install(path=None, *, env=None, rank=None, launch=None):
    """Register faulthandler for SIGUSR1 (all threads, not chained) writing into `path`
    (default: default_path()). The file is opened once, now, and kept open. Returns the path,
    or None when there is no path (no RK_STACK_DIR) or no SIGUSR1. Installing again returns the
    path already installed. OSError if the file cannot be created or is not a regular file
    (a FIFO, a device, a link)."""
    global _installed
    if _installed is not None:
        return _installed[0]
    if path is None:
        path = default_path(env, rank, launch)
    if path is None or not hasattr(signal, "SIGUSR1"):
        return None
    # not following a link, and never blocking on a FIFO (no reader: ENXIO); regular files only
    flags = (os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NONBLOCK
             | getattr(os, "O_NOFOLLOW", 0))
    fd = os.open(path, flags, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        f = os.fdopen(fd, "w")
    except BaseException:
        os.close(fd)
        raise
    faulthandler.register(signal.SIGUSR1, file=f, all_threads=True, chain=False)
    _installed = (path, f)
    return path


def installed():
    """The path stack dumps go to, or None."""
    return _installed[0] if _installed else None
