"""rekindle's checkpoint store in Python: the format and the rules of the C store
(docs/checkpoint.md; src/runtime/ckpt.c, ckpt_save.c, ckpt_store.c), so `rk ckpt ls|verify|export`
read what a Python job writes and a Python job resumes from what `rk train` wrote.

One checkpoint is one safetensors file DIR/ckpt-<step, 12 digits>.safetensors whose
`__metadata__` holds format "rekindle-ckpt-1", step, epoch, cursor, world_size, config, the
XXH64 (seed 0) of every tensor's bytes ("xxh64.<name>") and of the manifest text
("xxh64.__manifest__"). DIR/latest names the newest. A save writes a temporary file beside the
final name, fsyncs it, renames it, fsyncs the directory, replaces `latest` the same way, then
applies retention and removes dead writers' temporary files. A load checks everything (bounded
reads, regular files only, every checksum) and names the file and the tensor or field that is
wrong. Needs the `xxhash` module (Debian: python3-xxhash). The file format itself (building
and verifying one file) is in rekindle._ckptfile; everything public there is here too.
"""

import errno
import itertools
import json
import os
import stat
import threading
import time

from ._ckptfile import (  # noqa: F401  (the public names, re-exported)
    DTYPE_SIZE,
    FINITE_PREFIXES,
    FORMAT,
    HEADER_MAX,
    INT_MAX,
    INT64_MAX,
    MAX_DIMS,
    SCAN_CHUNK,
    Checkpoint,
    CheckpointError,
    Item,
    NonFiniteError,
    StorageError,
    _FLOATS,
    _exact_scan,
    _open_regular,
    _os_error,
    _read_exact_into,
    _show,
    _u63,
    encode,
    file_name,
    load,
    must_be_finite,
    name_step,
    nonfinite_index,
    nonfinite_name,
    parse,
    verify,
)
from .worker import ckpt_env

__all__ = [
    "ASIDE_TAG", "DTYPE_SIZE", "FINITE_PREFIXES", "FORMAT", "HEADER_MAX", "INT64_MAX", "INT_MAX",
    "LATEST", "LATEST_MAX", "LOCK_FILE", "MAX_DIMS", "SCAN_CHUNK", "Checkpoint", "CheckpointError",
    "Item", "Lock", "LockedError", "MismatchError", "NonFiniteError", "StorageError", "aside_step",
    "check", "encode", "file_name", "list_checkpoints", "load", "load_latest", "load_step", "lock", "must_be_finite",
    "name_step", "nonfinite_index", "nonfinite_name", "parse", "read_latest", "save", "temp_pid",
    "unlock", "verify", "_FLOATS", "_exact_scan",
]  # fmt: skip

LATEST = "latest"
LOCK_FILE = ".lock"
ASIDE_TAG = ".bad-"
LATEST_MAX = 4096  # bytes a `latest` file may have
WRITE_CHUNK = 8 << 20  # bytes per os.write
CACHE_BOUND = 32 << 20  # bytes of a file being written kept in the page cache
_tmp_counter = itertools.count()
_tmp_lock = threading.Lock()


class LockedError(CheckpointError):
    """Another job holds the directory's lock; `holder` is its pid (0 if not written yet or unreadable)."""

    def __init__(self, msg, holder=0):
        super().__init__(msg)
        self.holder = holder


# ---- names --------------------------------------------------------------------------------


def temp_pid(name):
    """The writer's pid if `name` is a temporary file of a checkpoint or of `latest`
    ("<target>.tmp.<pid>.<n>"), else None."""
    i = name.find(".tmp.")
    if i < 0:
        return None
    base, rest = name[:i], name[i + 5 :]
    if base != LATEST and name_step(base) is None:
        return None
    pid, dot, n = rest.partition(".")
    if not dot:
        return None
    p, k = _u63(pid), _u63(n)
    if p is None or k is None or not 0 < p <= INT_MAX:
        return None
    return p


def aside_step(name):
    """The step of a checkpoint a save moved aside ("<name>.bad-<unix time>[-<k>]"), else None."""
    i = name.find(ASIDE_TAG)
    if i < 0:
        return None
    s = name_step(name[:i])
    if s is None:
        return None
    when, dash, k = name[i + len(ASIDE_TAG) :].partition("-")
    if _u63(when) is None or (dash and _u63(k) is None):
        return None
    return s


# ---- saving -------------------------------------------------------------------------------


_verified = {}  # (dev, ino, size, mtime_ns) of files this process wrote or verified
_VERIFIED_MAX = 64
_verified_lock = threading.Lock()


def _key(st):
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _verified_add(path):
    try:
        k = _key(os.stat(path))
    except OSError:
        return
    with _verified_lock:  # threads may save and load at once
        if len(_verified) >= _VERIFIED_MAX:
            _verified.pop(next(iter(_verified)), None)
        _verified[k] = True


def _verify_cached(path):
    """Written or verified by this process and unchanged since, or verified now."""
    try:
        k = _key(os.stat(path))
        with _verified_lock:
            if k in _verified:
                return True
        load(path)
    except (OSError, CheckpointError):
        return False
    _verified_add(path)
    return True


def _fsync_dir(d):
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL:  # a file system that cannot sync directories (as the C store)
            raise
    finally:
        os.close(fd)


def _make_dirs(d):
    """mkdir -p, fsync'ing each parent that gained an entry."""
    try:
        st = os.stat(d)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISDIR(st.st_mode):
            raise CheckpointError(f"{d}: exists and is not a directory")
        return
    parts = []
    p = os.path.normpath(d)
    while p and not os.path.isdir(p):
        parts.append(p)
        q = os.path.dirname(p)
        if q == p:
            break
        p = q
    for p in reversed(parts):
        try:
            os.mkdir(p, 0o755)
        except FileExistsError:
            if not os.path.isdir(p):
                raise CheckpointError(f"{d}: {p} exists and is not a directory") from None
            continue
        except OSError as e:
            raise _os_error(e, f"{d}: cannot create directory {p}") from None
        try:
            _fsync_dir(os.path.dirname(p) or ".")
        except OSError:
            pass


class _AtomicFile:
    """A file written through "<path>.tmp.<pid>.<n>" (O_EXCL): fsync, rename, directory fsync.
    At most CACHE_BOUND bytes of it stay in the page cache while it is written: each piece is
    synced and dropped, so a large checkpoint reuses those pages instead of taking fresh ones
    (the C store's rule, rekindle/fileio.h)."""

    def __init__(self, path):
        self.path = path
        self.dir = os.path.dirname(path) or "."
        self.written = self.dropped = 0
        while True:
            with _tmp_lock:
                n = next(_tmp_counter)
            self.tmp = f"{path}.tmp.{os.getpid()}.{n}"
            try:
                self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                                  0o644)
                return
            except FileExistsError:
                continue
            except OSError as e:
                raise _os_error(e, f"{self.tmp}: cannot create") from None

    def write(self, data):
        mv = memoryview(data).cast("B")
        off = 0
        try:
            while off < len(mv):
                n = os.write(self.fd, mv[off : off + WRITE_CHUNK])
                off += n
                self.written += n
                if self.written - self.dropped >= CACHE_BOUND:
                    self._drop()
        except OSError as e:
            raise _os_error(e, f"{self.tmp}: cannot write") from None

    def _drop(self):
        """Sync what was written and drop it from the page cache."""
        os.fdatasync(self.fd)
        try:
            os.posix_fadvise(self.fd, self.dropped, self.written - self.dropped,
                             os.POSIX_FADV_DONTNEED)
        except (OSError, AttributeError):
            pass  # only a hint
        self.dropped = self.written

    def commit(self, before_rename=None):
        try:
            os.fsync(self.fd)
        except OSError as e:
            raise _os_error(e, f"{self.tmp}: cannot fsync") from None
        fd, self.fd = self.fd, -1  # closed once, even when close fails (abort must not again)
        try:
            os.close(fd)
        except OSError as e:
            raise _os_error(e, f"{self.tmp}: cannot close") from None
        if before_rename:
            before_rename()
        try:
            os.rename(self.tmp, self.path)
        except OSError as e:
            raise _os_error(e, f"{self.path}: cannot rename {os.path.basename(self.tmp)} to it") from None
        self.tmp = None
        try:
            _fsync_dir(self.dir)
        except OSError as e:
            raise _os_error(e, f"{self.dir}: cannot fsync the directory") from None

    def abort(self):
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            try:
                os.close(fd)
            except OSError:
                pass  # the temporary file goes all the same
        if self.tmp:
            try:
                os.unlink(self.tmp)
            except OSError:
                pass


def _write_file(path, chunks, before_rename=None):
    f = _AtomicFile(path)
    try:
        for c in chunks:
            f.write(c)
        f.commit(before_rename)
    except BaseException:
        f.abort()
        raise


def _set_aside(d, path):
    """A file already at `path` that does not verify is evidence: rename it to
    "<name>.bad-<unix seconds>[-<k>]" and fsync the directory. One that verifies is replaced."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise _os_error(e, f"{path}: cannot check the file to replace") from None
    if stat.S_ISREG(st.st_mode) and _verify_cached(path):
        return
    now = max(0, int(time.time()))
    for k in range(1000):
        to = f"{path}{ASIDE_TAG}{now}" + (f"-{k}" if k else "")
        if os.path.lexists(to):
            continue
        try:
            os.rename(path, to)
        except OSError as e:
            raise _os_error(e, f"{path}: does not verify and cannot be moved aside to "
                            f"{os.path.basename(to)} (it is kept; the new checkpoint is not "
                            "written)") from None
        try:
            _fsync_dir(d)
        except OSError as e:
            raise _os_error(e, f"{d}: cannot fsync the directory") from None
        return
    raise CheckpointError(f"{path}: does not verify and every name to move it aside to is taken")


def _scan(d):
    """[(step, name)] of the checkpoint files of `d`, highest step first."""
    try:
        names = os.listdir(d)
    except OSError as e:
        raise _os_error(e, f"{d}: cannot open checkpoint directory") from None
    v = [(s, n) for n in names if (s := name_step(n)) is not None]
    v.sort(reverse=True)
    return v


def _retain(d, step, keep):
    """Retention after `step` was saved (docs/checkpoint.md), then dead writers' temporary
    files. Failures are left for the next save."""
    try:
        v = _scan(d)
    except (OSError, CheckpointError):
        return
    kept, removed = 1, 0
    for s, name in v:
        if s >= step:
            continue  # the new one, or a later timeline: never ours to remove
        path = os.path.join(d, name)
        if _verify_cached(path):  # a checkpoint that does not verify is left for the operator
            if kept < keep:
                kept += 1
            else:
                try:
                    os.unlink(path)
                    removed += 1
                except OSError:
                    pass
    try:
        names = os.listdir(d)
    except OSError:
        names = []
    me = os.getpid()
    for name in names:
        pid = temp_pid(name)
        if pid is None or pid == me:
            continue
        try:
            os.kill(pid, 0)
            continue  # alive: perhaps still writing
        except ProcessLookupError:
            pass
        except OSError:
            continue  # not ours to signal: alive
        try:
            os.unlink(os.path.join(d, name))
            removed += 1
        except OSError:
            pass
    if removed:
        try:
            _fsync_dir(d)
        except OSError:
            pass


def save(dir, step, items, *, epoch=0, cursor=0, world_size=1, config="{}", keep=3):
    """Save a checkpoint of `step` (items: a list of Item) into `dir` with the C store's rules;
    returns its path. Bad arguments (nothing on disk changes): CheckpointError, NonFiniteError
    for a NaN or infinity in a model.*/optim.* float. Storage refusing a file: StorageError."""
    if not isinstance(dir, (str, os.PathLike)) or not os.fspath(dir):
        raise CheckpointError("ckpt.save: empty directory")
    d = os.fspath(dir)
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise CheckpointError(f"{d}: keep {keep!r} is not at least 1")
    name = file_name(step) if isinstance(step, int) and not isinstance(step, bool) and step >= 0 \
        else None
    if name is None:
        raise CheckpointError(f"{d}: step {step!r} is not an integer >= 0")
    path = os.path.join(d, name)
    hdr, datas = encode(step, items, epoch=epoch, cursor=cursor, world_size=world_size,
                        config=config, label=path)
    _make_dirs(d)
    _write_file(path, [hdr, *datas], before_rename=lambda: _set_aside(d, path))
    _verified_add(path)
    _write_file(os.path.join(d, LATEST), [(name + "\n").encode()])
    _retain(d, step, keep)
    return path


# ---- loading ------------------------------------------------------------------------------


def read_latest(dir):
    """The checkpoint name `dir`/latest holds. CheckpointError (missing, empty, not a
    checkpoint name); StorageError when it cannot be read."""
    path = os.path.join(os.fspath(dir), LATEST)
    try:
        fd, size = _open_regular(path, LATEST_MAX)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    try:
        buf = bytearray(size)
        _read_exact_into(fd, memoryview(buf), 0, path)
    finally:
        os.close(fd)
    data = bytes(buf)
    if data.endswith(b"\n"):
        data = data[:-1]
    if not data:
        raise CheckpointError(f"{path}: is empty")
    if b"\0" in data:
        raise CheckpointError(f"{path}: holds a NUL byte, not a checkpoint file name")
    try:
        name = data.decode("utf-8")
    except UnicodeDecodeError:
        name = ""
    if name_step(name) is None:
        raise CheckpointError(f"{path}: does not hold a checkpoint file name "
                              "(ckpt-<step>.safetensors)")
    return name


def _stop(dir, e):
    """The error of a load that met a file it cannot read: no fallback."""
    msg = (f"{e}; a checkpoint that exists but cannot be read is not skipped: fix it "
           f"(permissions, disk) or move it out of {dir}")
    if isinstance(e, StorageError):
        return StorageError(e.errno, msg, e.filename)
    return CheckpointError(msg, unreadable=True)


class MismatchError(CheckpointError):
    """A valid checkpoint that is not what the caller can resume (check(), `expect`)."""


def _json_same(a, b):
    """JSON equality as jansson's json_equal: an integer is not a real, a bool not a number."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_json_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_json_same(x, y) for x, y in zip(a, b))
    return a == b


def _json_text(v):
    return "(absent)" if v is _ABSENT else _show(json.dumps(v, separators=(",", ":")), 90)


_ABSENT = object()


def check(c, expect):
    """MismatchError unless checkpoint `c` is what `expect` asks, as rk_ckpt_check: expect is
    {"config": {key: value, ...}, "items": {name: (dtype, shape), ...}}, both optional; every
    key of "config" must be in c's config with an equal JSON value, every item present with
    that dtype and shape."""
    if not expect:
        return
    L = _show(c.path, 400)
    want = expect.get("config")
    if want is not None:
        if isinstance(want, str):
            want = json.loads(want)
        if not isinstance(want, dict):
            raise CheckpointError("expected config is not a JSON object")
        try:
            have = json.loads(c.config)
        except ValueError:
            have = None
        for k, wv in want.items():
            hv = have.get(k, _ABSENT) if isinstance(have, dict) else _ABSENT
            if hv is _ABSENT or not _json_same(hv, wv):
                raise MismatchError(f"{L}: config '{_show(k)}' is {_json_text(hv)}, expected "
                                    f"{_json_text(wv)}")
    for name, (dtype, shape) in (expect.get("items") or {}).items():
        it = c.items.get(name)
        if it is None:
            raise MismatchError(f"{L}: tensor '{_show(name)}' is missing")
        if it.dtype != dtype or tuple(it.shape) != tuple(shape):
            have_s = "[" + ",".join(map(str, it.shape)) + "]"
            want_s = "[" + ",".join(map(str, shape)) + "]"
            raise MismatchError(f"{L}: tensor '{_show(name)}' is {it.dtype} {have_s}, expected "
                                f"{str(dtype)[:8]} {want_s}")


def _load_expected(path, expect):
    c = load(path)
    check(c, expect)
    return c


def load_latest(dir, expect=None):
    """The newest checkpoint of `dir` that verifies, by the C loader's rule: the one `latest`
    names, else every checkpoint from the highest step down. Returns (Checkpoint or None,
    skipped): one line per file skipped and per problem with `latest`. With `expect` (see
    check()) a checkpoint of another model or shape is skipped like a corrupt one. A file that
    exists but cannot be read (permissions, I/O, not a regular file) stops the search:
    StorageError or CheckpointError (its content may be the run's newest work). A missing
    directory: (None, [])."""
    d = os.fspath(dir)
    try:
        v = _scan(d)
    except CheckpointError as e:
        if not os.path.lexists(d):
            return None, []
        raise e
    report = []
    lname = ""
    try:
        lname = read_latest(d)
    except StorageError as e:
        raise _stop(d, e) from None
    except CheckpointError as e:
        if e.unreadable:
            raise _stop(d, e) from None
        if v or not str(e).endswith(": missing"):
            report.append(str(e))
        lname = ""
    if lname:
        try:
            c = _load_expected(os.path.join(d, lname), expect)
        except (StorageError, CheckpointError) as e:
            if isinstance(e, StorageError) or e.unreadable:
                raise _stop(d, e) from None
            report.append(str(e))
        else:
            for s, n in v:
                if s > c.step:
                    report.append(f"{d}/{n}: newer than the checkpoint 'latest' names ({lname}); "
                                  "not used")
            return c, report
    for _, n in v:
        if n == lname:
            continue
        try:
            return _load_expected(os.path.join(d, n), expect), report
        except (StorageError, CheckpointError) as e:
            if isinstance(e, StorageError) or e.unreadable:
                raise _stop(d, e) from None
            report.append(str(e))
    return None, report


def load_step(dir, step):
    """The checkpoint of exactly `step` (no fallback, for rollbacks)."""
    return load(os.path.join(os.fspath(dir), file_name(step)))


def list_checkpoints(dir):
    """[(step, name)] of `dir`'s checkpoint files, highest step first."""
    return _scan(os.fspath(dir))


# ---- the writer's lock --------------------------------------------------------------------


class Lock:
    """The directory's writer lock (an exclusive flock on DIR/.lock), or a no-op one (`held`
    False) when rk run holds it for RK_CKPT_DIR. Release with unlock() or a `with` block."""

    def __init__(self, dir, fd):
        self.dir = dir
        self.fd = fd

    @property
    def held(self):
        return self.fd is not None

    def __enter__(self):
        return self

    def __exit__(self, *a):
        unlock(self)


def _under_rk_run(d, env):
    ck, _ = ckpt_env(env)
    if not env.get("RK_HEARTBEAT") or not ck:
        return False
    try:
        return os.path.samefile(d, ck)
    except OSError:
        return os.path.abspath(d) == os.path.abspath(ck)


def lock(dir, env=None):
    """Take `dir`'s writer lock like rk_ckpt_lock: created with the directory if missing,
    flock without waiting, the pid written in. Skipped (a Lock with held False) under rk run
    for RK_CKPT_DIR, which the supervisor holds. LockedError naming the holder's pid when
    another job has it."""
    import fcntl

    env = os.environ if env is None else env
    d = os.fspath(dir)
    if not d:
        raise CheckpointError("ckpt.lock: empty directory")
    if _under_rk_run(d, env):
        return Lock(d, None)
    _make_dirs(d)
    path = os.path.join(d, LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK,
                     0o644)
    except OSError as e:
        raise _os_error(e, f"{path}: cannot open the lock file") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(f"{path}: the lock file is not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            unread = None
            try:
                raw = os.pread(fd, 32, 0).split(b"\n")[0]
            except OSError as e:  # still locked by someone: say so, not the read's error
                raw, unread = b"", e.strerror or str(e)
            pid = _u63(raw.decode("ascii", "replace")) or 0
            if pid > INT_MAX:
                pid = 0
            who = (f"pid {pid} holds {path}" if pid else
                   f"it holds {path}, its pid cannot be read: {unread}" if unread else
                   f"it holds {path}, its pid not written yet")
            raise LockedError(f"{d}: another job writes to this checkpoint directory ({who}); one "
                              "writer per directory", pid) from None
        except OSError as e:
            raise _os_error(e, f"{path}: cannot lock") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as e:
            raise _os_error(e, f"{path}: cannot write the pid") from None
    except BaseException:
        os.close(fd)
        raise
    return Lock(d, fd)


def unlock(lk):
    """Release a lock from lock() (the file stays). None and a no-op lock are fine."""
    if lk is not None and lk.fd is not None:
        os.close(lk.fd)
        lk.fd = None
