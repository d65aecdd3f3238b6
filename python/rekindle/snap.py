"""The node's snapshot store in Python: the layout and rules of src/runtime/snap.c
(include/rekindle/snap.h, docs/recovery.md), so a Python rank and a C rank (or the node agent)
read each other's snapshots.

A snapshot is a checkpoint of one rank (rekindle._ckptfile's format: the same bytes, the same
checksums) kept in a tmpfs so that it outlives the rank's process. A job's directory
(make_dir: /dev/shm/rk-snap-XXXXXX, 0700, the job's user's) holds rank-<R>/ (0700) and in it
at most two generations snap-<step, 12 digits>.safetensors. put() writes a temporary file
"<name>.tmp.<pid>.<n>" (O_EXCL, 0600, no fsync: it is memory) and renames it into place, after
deleting every generation but the step itself and the newest below it (those above it too: a
timeline that was rolled back) and the temporary files of dead writers. get() verifies
everything and the step inside against the name; agree() gives the newest step every rank has
and that verifies, never a mix. Every directory is opened without following a link and must be
0700 and ours; a generation must be a regular file, opened without following a link.
RngSlot and rng_slot_read: a rank's RNG slots in DIR/cache/rng-rank-<R> (Python only: recovery
in place for rekindle.torch).
"""

import errno
import itertools
import os
import stat
import struct
import tempfile
import zlib

from ._ckptfile import (
    CheckpointError,
    StorageError,
    _os_error,
    _read_exact_into,
    _show,
    _u63,
    encode,
    kind_name,
    parse,
)

__all__ = [
    "DIR_ENV", "DIR_PREFIX", "KEEP", "MARGIN_DIV", "MARGIN_MIN", "MEMAVAIL_ENV", "PARENT_DEFAULT",
    "SnapshotError",
    "SnapshotMissing", "RngSlot", "agree", "bytes_held", "check_dir", "file_name", "from_bytes", "get", "make_dir",
    "name_step", "pin", "put", "raw", "remove_dir", "rng_slot_name", "rng_slot_read", "rng_slot_size", "room", "steps",
]  # fmt: skip

PARENT_DEFAULT = "/dev/shm"
DIR_ENV = "RK_SNAP_DIR"
DIR_PREFIX = "rk-snap-"
OWNER_NAME = ".owner"  # who made the directory (rekindle/snap.h RK_SNAP_OWNER_NAME)
CACHE_NAME = "cache"  # the job's cache of a rank's own files (rk_snap_cache_dir)
KEEP = 2  # generations per rank
MARGIN_MIN = 64 << 20  # room(): at least 64 MiB left free ...
MARGIN_DIV = 10  # ... and at least a tenth of the tmpfs (of the RAM: MemTotal)
MEMAVAIL_ENV = "RK_SNAP_MEMAVAIL_BYTES"  # for tests: room() takes it as MemAvailable (bytes)
WRITE_CHUNK = 8 << 20
INT_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_tmp_counter = itertools.count()  # next() on it is atomic


class SnapshotError(CheckpointError):
    """A snapshot directory or generation that cannot be used (not 0700, not ours, a link, not a
    regular file, a bad argument)."""


class SnapshotMissing(SnapshotError):
    """No such directory or generation."""


# ---- names --------------------------------------------------------------------------------


def file_name(step):
    """"snap-<step as 12 digits>.safetensors" (more digits past 10^12)."""
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= INT64_MAX:
        raise SnapshotError(f"step {step!r} is not an integer >= 0")
    return f"snap-{step:012d}.safetensors"


def name_step(name):
    """The step of a generation's name exactly as file_name writes it, else None."""
    if not name.startswith("snap-") or not name.endswith(".safetensors"):
        return None
    d = name[5 : -len(".safetensors")]
    if not 12 <= len(d) <= 19 or not d.isascii() or not d.isdigit():
        return None
    v = int(d)
    return v if v <= INT64_MAX and file_name(v) == name else None


def _temp_target(name):
    """The generation's step of a temporary file "<generation>.tmp.<pid>.<n>" and its pid,
    else None."""
    i = name.find(".tmp.")
    if i < 0 or name_step(name[:i]) is None:
        return None
    pid, dot, n = name[i + 5 :].partition(".")
    p = _u63(pid)
    if not dot or p is None or _u63(n) is None or not 0 < p <= INT_MAX:
        return None
    return p


def _rank_name(rank):
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= INT_MAX:
        raise SnapshotError(f"rank {rank!r} is not an integer >= 0")
    return f"rank-{rank}"


def _rank_of(name):
    if not name.startswith("rank-"):
        return None
    v = _u63(name[5:])
    return v if v is not None and v <= INT_MAX else None


# ---- checked directories ------------------------------------------------------------------


def _open_nofollow(name, flags, dir_fd, what, missing, not_kind):
    """os.open of `name` with `flags` (O_NOFOLLOW among them; with O_CREAT, mode 0600):
    SnapshotMissing "what: missing" if absent; a link or another kind of file is SnapshotError
    "what: is a ..., not_kind"."""
    try:
        return os.open(name, flags, 0o600, dir_fd=dir_fd)
    except FileNotFoundError:
        raise SnapshotMissing(f"{what}: {missing}") from None
    except OSError as e:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            raise _os_error(e, f"{what}: cannot open") from None
        raise SnapshotError(f"{what}: is {kind_name(st.st_mode)}, {not_kind}") from None


def _open_checked(name, what, dir_fd=None):
    """An fd of the directory `name` (never through a link), ours and 0700."""
    fd = _open_nofollow(name, _DIR_FLAGS, dir_fd, what, "does not exist",
                        "not a directory (a snapshot directory is a real directory, mode 0700)")
    st = os.fstat(fd)
    problem = None
    if st.st_uid != os.geteuid():
        problem = (f"{what}: is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}): "
                   "snapshots are readable only by the job's user")
    elif stat.S_IMODE(st.st_mode) != 0o700:
        problem = (f"{what}: has mode {stat.S_IMODE(st.st_mode):04o}, not 0700: snapshots are "
                   "readable only by the job's user")
    if problem:
        os.close(fd)
        raise SnapshotError(problem)
    return fd


def _job_fd(dir):
    dir = os.fspath(dir)
    if not dir:
        raise SnapshotError("empty snapshot directory")
    return dir, _open_checked(dir, _show(dir, 400))


def _sub_fd(dir, name, make):
    """(fd of DIR/<name>, its label): made (0700) when `make` and missing; checked (a real
    directory, ours, 0700); SnapshotMissing if it (or DIR) does not exist."""
    dir, jfd = _job_fd(dir)
    what = f"{_show(dir, 400)}/{name}"
    try:
        if make:
            try:
                os.mkdir(name, 0o700, dir_fd=jfd)
            except FileExistsError:
                pass
            except OSError as e:
                raise _os_error(e, f"{what}: cannot create") from None
        return _open_checked(name, what, dir_fd=jfd), what
    finally:
        os.close(jfd)


def _rank_fd(dir, rank, make=False):
    """(fd of DIR/rank-<R>, its label); SnapshotMissing if it (or DIR) does not exist."""
    return _sub_fd(dir, _rank_name(rank), make)


def check_dir(dir):
    """None if `dir` is a usable snapshot directory (a directory, not a link, 0700, ours);
    SnapshotMissing or SnapshotError naming the problem otherwise."""
    os.close(_job_fd(dir)[1])


def make_dir(parent=None):
    """A new job directory PARENT/rk-snap-XXXXXX (mkdtemp: 0700), checked; its path."""
    parent = os.fspath(parent) if parent is not None else PARENT_DEFAULT
    try:
        st = os.stat(parent)
    except FileNotFoundError:
        raise SnapshotMissing(f"{_show(parent)}: cannot use as the parent of snapshots: does not "
                              "exist") from None
    if not stat.S_ISDIR(st.st_mode):
        raise SnapshotError(f"{_show(parent)}: is {kind_name(st.st_mode)}, not a directory")
    try:
        d = tempfile.mkdtemp(prefix=DIR_PREFIX, dir=parent)
    except OSError as e:
        raise _os_error(e, f"{_show(parent)}: cannot make a snapshot directory") from None
    try:
        check_dir(d)
    except CheckpointError:
        os.rmdir(d)
        raise
    return d


def _remove_cache(dir, jfd):
    """DIR/cache (rk_snap_cache_dir): what it holds but directories (a link: the link), then
    it. The error, or None."""
    what = f"{_show(dir, 400)}/{CACHE_NAME}"
    try:
        cfd = _open_checked(CACHE_NAME, what, dir_fd=jfd)
    except CheckpointError as e:
        return e
    try:
        for n in os.listdir(cfd):
            try:
                if not stat.S_ISDIR(os.stat(n, dir_fd=cfd, follow_symlinks=False).st_mode):
                    os.unlink(n, dir_fd=cfd)
            except OSError:
                pass
    finally:
        os.close(cfd)
    try:
        os.rmdir(CACHE_NAME, dir_fd=jfd)
    except OSError as e:
        return SnapshotError(f"{what}: cannot remove: {e.strerror}")
    return None


def remove_dir(dir):
    """Remove a job directory: every rank's generations and temporary files, the rank
    directories, the cache (rk_snap_cache_dir's DIR/cache), the maker's .owner, the directory. A file the store did not make stays, and so does its directory:
    SnapshotError naming it."""
    dir, jfd = _job_fd(dir)
    first = None
    try:
        for rname in os.listdir(jfd):
            if rname == CACHE_NAME:
                first = _remove_cache(dir, jfd) or first
                continue
            if _rank_of(rname) is None:
                continue
            what = f"{_show(dir, 400)}/{rname}"
            try:
                rfd = _open_checked(rname, what, dir_fd=jfd)
            except CheckpointError as e:
                first = first or e
                continue
            try:
                for n in os.listdir(rfd):
                    if name_step(n) is not None or _temp_target(n) is not None:
                        os.unlink(n, dir_fd=rfd)
            finally:
                os.close(rfd)
            try:
                os.rmdir(rname, dir_fd=jfd)
            except OSError as e:
                first = first or SnapshotError(f"{what}: cannot remove: {e.strerror} (a file not "
                                               "made by the snapshot store is left)")
        try:  # the maker's .owner (rk_snap_dir_make writes one): a link is the link
            if stat.S_ISREG(os.stat(OWNER_NAME, dir_fd=jfd, follow_symlinks=False).st_mode) or \
                    stat.S_ISLNK(os.stat(OWNER_NAME, dir_fd=jfd, follow_symlinks=False).st_mode):
                os.unlink(OWNER_NAME, dir_fd=jfd)
        except FileNotFoundError:
            pass
    finally:
        os.close(jfd)
    if first:
        raise first
    try:
        os.rmdir(dir)
    except OSError as e:
        raise SnapshotError(f"{_show(dir, 400)}: cannot remove: {e.strerror} (a file not made by "
                            "the snapshot store is left)") from None


# ---- a rank's RNG slot (recovery in place) -------------------------------------------------

RNG_SLOT_BYTES = 16384  # a slot's room for the RNG states (torch's CPU state is 5,056 bytes)
RNG_SLOT_EXTRA_MAX = 16 << 20  # the most bytes of buffers a slot holds besides
_RNG_MAGIC = b"RKRNGSL3"
# magic, step, launch, serial, the slot's size, bytes of torch's, cuda's, the buffers, more
# states (numpy's and Python's, where the rank writes them), crc32
_RNG_HEAD = struct.Struct("<8sqqqIIIIII")


def rng_slot_name(rank):
    """"rng-rank-<R>": the file in the job's cache (DIR/cache) that holds rank R's RNG slots."""
    return "rng-" + _rank_name(rank)


def rng_slot_size(extra=0):
    """The bytes of one slot that holds `extra` bytes of buffers besides the RNG states (writer
    and reader compute it alike: the reader is the same program's replacement of the rank);
    ValueError past RNG_SLOT_EXTRA_MAX."""
    if not 0 <= extra <= RNG_SLOT_EXTRA_MAX:
        raise ValueError(f"{extra} bytes of buffers: a slot holds at most {RNG_SLOT_EXTRA_MAX}")
    return -(-(_RNG_HEAD.size + RNG_SLOT_BYTES + extra) // 4096) * 4096


class RngSlot:
    """A rank's RNG states of its newest step attempts, written at each attempt's start (a
    pwrite of a few KiB into a tmpfs: microseconds), so that the rank replaced in place after it
    died can take its own RNG states of the step the survivors kept (docs/recovery.md, "Healed
    from the ranks kept"); and, where asked (`extra`: rank 0 of a job whose buffers DDP
    broadcasts at each forward), its buffers. Two slots, by the step's parity: a rank killed in
    the middle of a write leaves the other slot whole, and a torn slot fails its CRC. Each slot
    names its step and the writer's launch and attempt serial, which the reader must match."""

    def __init__(self, dir, rank, extra=0):
        self.size = rng_slot_size(extra)
        name = rng_slot_name(rank)
        cfd, what = _sub_fd(dir, CACHE_NAME, True)
        self.label = f"{what}/{name}"
        try:
            self.fd = _open_nofollow(name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK,
                                     cfd, self.label, "cannot create", "not a regular file")
        finally:
            os.close(cfd)
        st = os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            os.close(self.fd)
            self.fd = -1
            raise SnapshotError(f"{self.label}: not a regular file of this user with one link")

    def write(self, step, launch, serial, torch_state, cuda_state=b"", bufs=b"", more=b""):
        """Slot step % 2 holds these states and buffers (bytes) of `step`. ValueError when they
        do not fit a slot; OSError when the write fails."""
        parts = (torch_state, cuda_state, bufs, more)
        n = sum(len(p) for p in parts)
        if _RNG_HEAD.size + n > self.size:
            raise ValueError(f"{self.label}: {n} bytes of RNG states and buffers do not fit a slot of {self.size}")
        lens = (self.size, *(len(p) for p in parts))
        crc = zlib.crc32(_RNG_HEAD.pack(_RNG_MAGIC, step, launch, serial, *lens, 0))
        for part in parts:
            crc = zlib.crc32(part, crc)
        buf = b"".join((_RNG_HEAD.pack(_RNG_MAGIC, step, launch, serial, *lens, crc), *parts))
        if os.pwrite(self.fd, buf, (step % 2) * self.size) != len(buf):
            raise OSError(errno.ENOSPC, f"{self.label}: short write")

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def rng_slot_read(dir, rank, step, launch, serial, extra=0):
    """(torch state, cuda state, buffers, more states) (bytes) that rank `rank` wrote for `step` in launch
    `launch` as attempt `serial`, in slots of rng_slot_size(extra); SnapshotMissing when its
    slot holds another step or attempt (or there is none), SnapshotError when it is not a
    regular file, was written with another slot size, or fails its CRC (a torn write)."""
    size = rng_slot_size(extra)
    name = rng_slot_name(rank)
    cfd, what = _sub_fd(dir, CACHE_NAME, False)
    L = f"{what}/{name}"
    try:
        fd = _open_nofollow(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW,
                            cfd, L, "no RNG slot", "not a regular file")
    finally:
        os.close(cfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SnapshotError(f"{L}: not a regular file")
        buf = os.pread(fd, size, (step % 2) * size)  # bounded: one slot
    except OSError as e:
        raise _os_error(e, f"{L}: cannot read") from None
    finally:
        os.close(fd)
    if len(buf) < _RNG_HEAD.size:
        raise SnapshotMissing(f"{L}: no slot of step {step}")
    magic, s, la, se, sz, *lens, crc = _RNG_HEAD.unpack_from(buf)
    if magic != _RNG_MAGIC:
        raise SnapshotError(f"{L}: slot {step % 2} is not an RNG slot")
    if sz != size:
        raise SnapshotError(f"{L}: slot {step % 2} was written {sz} bytes long, not {size}")
    if (s, la, se) != (step, launch, serial):
        raise SnapshotMissing(f"{L}: slot {step % 2} holds step {s} (launch {la}, attempt {se}), not step {step} "
                              f"(launch {launch}, attempt {serial})")
    end = _RNG_HEAD.size + sum(lens)
    if end > len(buf):
        raise SnapshotError(f"{L}: slot {step % 2} says {sum(lens)} bytes: more than a slot holds")
    if zlib.crc32(buf[_RNG_HEAD.size:end], zlib.crc32(_RNG_HEAD.pack(magic, s, la, se, sz, *lens, 0))) != crc:
        raise SnapshotError(f"{L}: slot {step % 2} (step {step}) fails its CRC: a torn write")
    out, off = [], _RNG_HEAD.size
    for n in lens:
        out.append(bytes(buf[off:off + n]))
        off += n
    return tuple(out)


# ---- one rank -----------------------------------------------------------------------------


def _scan(rfd):
    """Steps of the complete generations (regular files with a generation's name), newest first."""
    out = []
    for n in os.listdir(rfd):
        s = name_step(n)
        if s is None:
            continue
        try:
            st = os.stat(n, dir_fd=rfd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append(s)
    out.sort(reverse=True)
    return out


def _retain(rfd, step, recycle=None):
    """Before the copy of `step`: keep `step` and the newest generation below it, delete every
    other one (those above: a rolled-back timeline), anything else under a generation's name,
    and the temporary files of writers that died. The first generation to go is renamed to
    `recycle` (the copy's temporary name, written over in place: the tmpfs neither frees its
    pages nor allocates new ones), as the C store does; True when one was."""
    below = [s for s in _scan(rfd) if s < step]
    keep = {step} | ({below[0]} if below else set())
    recycled = False
    for n in os.listdir(rfd):
        s = name_step(n)
        pid = _temp_target(n) if s is None else None
        try:
            if s is not None:
                st = os.stat(n, dir_fd=rfd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and s in keep or stat.S_ISDIR(st.st_mode):
                    continue
                if recycle and not recycled and stat.S_ISREG(st.st_mode):
                    os.rename(n, recycle, src_dir_fd=rfd, dst_dir_fd=rfd)
                    recycled = True
                    continue
                os.unlink(n, dir_fd=rfd)
            elif pid is not None and pid != os.getpid():
                try:
                    os.kill(pid, 0)
                    continue  # alive: perhaps still writing
                except ProcessLookupError:
                    os.unlink(n, dir_fd=rfd)
                except PermissionError:
                    continue  # not ours to signal: alive
        except OSError:
            pass  # left for the next put
    return recycled


def _open_recycled(rfd, tmp):
    """An old generation renamed to `tmp` by _retain, opened to be written over: a regular file
    of ours with one link, else None (the caller removes it and makes a new one)."""
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=rfd)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
        os.close(fd)
        return None
    return fd


def put(dir, rank, step, items, *, epoch=0, cursor=0, world_size=1, config="{}"):
    """Write rank `rank`'s state as generation `step` (the items and fields of ckpt.save; the
    bytes are encode()'s). Bad items: CheckpointError (NonFiniteError for a NaN or an infinity
    in model.*/optim.*) and nothing written. A failed copy removes its temporary file and leaves
    the previous generation; StorageError when the tmpfs is full. Returns the generation's path."""
    name = file_name(step)
    rname = _rank_name(rank)
    label = f"{_show(os.fspath(dir), 400)}/{rname}/{name}"
    hdr, views = encode(step, items, epoch=epoch, cursor=cursor, world_size=world_size,
                        config=config, label=label)
    rfd, what = _rank_fd(dir, rank, make=True)
    try:
        tmp = f"{name}.tmp.{os.getpid()}.{next(_tmp_counter)}"
        fd = _open_recycled(rfd, tmp) if _retain(rfd, step, tmp) else None
        if fd is None:
            try:
                os.unlink(tmp, dir_fd=rfd)  # a recycled name that could not be opened
            except OSError:
                pass
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                             0o600, dir_fd=rfd)
            except OSError as e:
                raise _os_error(e, f"{what}: cannot create {tmp}") from None
        try:
            try:
                total = 0
                for chunk in [hdr, *views]:
                    mv = memoryview(chunk).cast("B")
                    off = 0
                    while off < mv.nbytes:
                        off += os.write(fd, mv[off : off + WRITE_CHUNK])
                    total += mv.nbytes
                os.ftruncate(fd, total)  # a recycled generation may have been longer
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=rfd, dst_dir_fd=rfd)
        except BaseException as e:
            try:
                os.unlink(tmp, dir_fd=rfd)
            except OSError:
                pass
            if isinstance(e, OSError):
                raise _os_error(e, f"{what}: cannot write the snapshot") from None
            raise
    finally:
        os.close(rfd)
    return os.path.join(os.fspath(dir), rname, name)


def pin_name(step):
    """"pin-<step as 12 digits>.safetensors": a pinned generation (rk_snap_pin_name)."""
    return "pin-" + file_name(step)[len("snap-"):]


def pin(dir, rank, step):
    """Pin generation `step` of rank `rank`: pin-<step> becomes a hard link to snap-<step> (its
    bytes never change while pinned: a put unlinks a pinned generation instead of writing over
    it). Unlike rk_snap_pin it removes no other pin: the reader it is made for removes it
    (rk run, after it wrote the checkpoint: rk_snap_unpin). SnapshotMissing if there is no
    such generation; StorageError if the link cannot be made. The rank's writer calls it,
    between its puts."""
    name, pname = file_name(step), pin_name(step)
    rfd, what = _rank_fd(dir, rank)
    try:
        try:
            st = os.stat(name, dir_fd=rfd, follow_symlinks=False)
        except FileNotFoundError:
            raise SnapshotMissing(f"{what}/{name}: no snapshot of step {step} to pin") from None
        if not stat.S_ISREG(st.st_mode):
            raise SnapshotError(f"{what}/{name}: is {kind_name(st.st_mode)}, not a regular file: not pinned")
        try:
            ps = os.stat(pname, dir_fd=rfd, follow_symlinks=False)
            if (ps.st_ino, ps.st_dev) == (st.st_ino, st.st_dev):
                return
            os.unlink(pname, dir_fd=rfd)  # an older pin of that step (a rolled-back timeline)
        except FileNotFoundError:
            pass
        try:
            os.link(name, pname, src_dir_fd=rfd, dst_dir_fd=rfd, follow_symlinks=False)
        except OSError as e:
            raise _os_error(e, f"{what}/{pname}: cannot link") from None
    finally:
        os.close(rfd)


def _read_at(rfd, what, step):
    """(the bytes of generation `step`, its label), unverified."""
    name = file_name(step)
    L = f"{what}/{name}"
    fd = _open_nofollow(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW,
                        rfd, L, f"no snapshot of step {step}", "not a regular file")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SnapshotError(f"{L}: is {kind_name(st.st_mode)}, not a regular file")
        buf = bytearray(st.st_size)  # the size from fstat bounds the read
        _read_exact_into(fd, memoryview(buf), 0, L)
        if os.pread(fd, 1, st.st_size):
            raise CheckpointError(f"{L}: file grew while it was read")
    except OSError as e:
        raise _os_error(e, f"{L}: cannot read") from None
    finally:
        os.close(fd)
    return buf, L


def from_bytes(buf, step, what):
    """Verify the bytes of a generation of step `step` (every checksum, the step inside): a
    Checkpoint whose items are views of `buf`. CheckpointError if they do not verify."""
    c = parse(buf, name=what)
    if c.step != step:
        raise CheckpointError(f"{what}: field 'step' is {c.step} but the file name says {step}")
    return c


def _get_at(rfd, what, step):
    buf, L = _read_at(rfd, what, step)
    return from_bytes(buf, step, L)


def get(dir, rank, step):
    """Read and verify generation `step` of rank `rank`: a Checkpoint. SnapshotMissing if there
    is none, SnapshotError if it is not a regular file, CheckpointError if it does not verify."""
    rfd, what = _rank_fd(dir, rank)
    try:
        return _get_at(rfd, what, step)
    finally:
        os.close(rfd)


def raw(dir, rank, step):
    """The bytes of rank `rank`'s generation `step` (a bytearray), read as get() reads them but
    not verified: to send to a rank on another node, which verifies them (from_bytes)."""
    rfd, what = _rank_fd(dir, rank)
    try:
        return _read_at(rfd, what, step)[0]
    finally:
        os.close(rfd)


def steps(dir, rank):
    """The steps of rank `rank`'s complete generations (not verified), newest first; [] when
    the rank has no directory yet."""
    try:
        rfd, _ = _rank_fd(dir, rank)
    except SnapshotMissing:
        check_dir(dir)  # the job's directory itself must exist
        return []
    try:
        return _scan(rfd)
    finally:
        os.close(rfd)


def agree(dir, world):
    """(step, skipped): the newest step for which every rank 0..world-1 has a generation that
    verifies, or None; skipped lists "<path>: <why>" for each generation that did not verify."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise SnapshotError(f"world size {world!r} is not at least 1")
    fds, lists, skipped = [], [], []
    try:
        for r in range(world):
            try:
                fd, what = _rank_fd(dir, r)
            except SnapshotMissing:
                check_dir(dir)
                return None, skipped
            fds.append((fd, what))
            lists.append(set(_scan(fd)))
        for s in sorted(lists[0], reverse=True):
            if not all(s in v for v in lists):
                continue
            good = True
            for fd, what in fds:
                try:
                    _get_at(fd, what, s)
                except (CheckpointError, StorageError) as e:
                    skipped.append(str(e))
                    good = False
                    break
            if good:
                return s, skipped
        return None, skipped
    finally:
        for fd, _ in fds:
            os.close(fd)


def bytes_held(dir):
    """The sum of the sizes of every rank's complete generations."""
    dir, jfd = _job_fd(dir)
    total = 0
    try:
        for rname in os.listdir(jfd):
            if _rank_of(rname) is None:
                continue
            rfd = _open_checked(rname, f"{_show(dir, 400)}/{rname}", dir_fd=jfd)
            try:
                for s in _scan(rfd):
                    total += os.stat(file_name(s), dir_fd=rfd, follow_symlinks=False).st_size
            finally:
                os.close(rfd)
    finally:
        os.close(jfd)
    return total


def _mem_info():
    """(MemAvailable, MemTotal, overridden) in bytes from /proc/meminfo (at most 16 KiB read);
    MemAvailable None when the kernel does not say (and MEMAVAIL_ENV is not set)."""
    found = {}
    try:
        with open("/proc/meminfo", "rb") as f:
            text = f.read(16384).decode("ascii", "replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if key in ("MemAvailable", "MemTotal") and key not in found and len(parts) == 2 \
                and parts[1] == "kB" and parts[0].isdigit():
            found[key] = int(parts[0]) * 1024
    avail, total = found.get("MemAvailable"), found.get("MemTotal", 0)
    o = os.environ.get(MEMAVAIL_ENV, "")
    if o:
        if not (o.isascii() and o.isdigit()) or int(o) > INT64_MAX:
            raise SnapshotError(f"{MEMAVAIL_ENV}='{_show(o, 64)}': not a count of bytes (decimal)")
        return int(o), total, True
    return avail, total, False


def room(dir, bytes_per_gen, ranks_here, keep=KEEP):
    """(ok, why): whether `keep` generations (KEEP by default; rekindle.torch asks for more where
    rk run writes its checkpoints from the snapshots: the pinned ones and rk run's copy) of
    `ranks_here` ranks of `bytes_per_gen` bytes fit in
    the tmpfs of `dir` and in the node's RAM (MemAvailable: tmpfs pages are RAM), each with its
    margin (rk_snap_room's rule, docs/recovery.md)."""
    if ranks_here < 1:
        raise SnapshotError(f"{ranks_here} local ranks")
    held = bytes_held(dir)
    sv = os.statvfs(dir)
    fr = sv.f_frsize or sv.f_bsize
    total, avail = sv.f_blocks * fr, sv.f_bavail * fr
    ram_avail, ram_total, overridden = _mem_info()
    need = keep * ranks_here * bytes_per_gen
    margin = max(MARGIN_MIN, total // MARGIN_DIV)
    ram_margin = max(MARGIN_MIN, ram_total // MARGIN_DIV)
    tmpfs_fits = need + margin <= avail + held
    ram_fits = ram_avail is None or need + ram_margin <= ram_avail + held
    if tmpfs_fits and ram_fits:
        return True, ""
    mib = 1 << 20
    if not tmpfs_fits:
        return False, (f"{_show(os.fspath(dir), 400)}: snapshots need {need / mib:.1f} MiB ({keep} "
                       f"generations x {ranks_here} ranks x {bytes_per_gen / mib:.1f} MiB) and a "
                       f"margin of {margin / mib:.1f} MiB; the tmpfs there has {avail / mib:.1f} "
                       f"MiB free and this job holds {held / mib:.1f} MiB: "
                       f"{(need + margin - avail - held) / mib:.1f} MiB short")
    return False, (f"{_show(os.fspath(dir), 400)}: snapshots need {need / mib:.1f} MiB of RAM "
                   f"({keep} generations x {ranks_here} ranks x {bytes_per_gen / mib:.1f} MiB; "
                   f"tmpfs pages are RAM) and a margin of {ram_margin / mib:.1f} MiB; the node has "
                   f"{ram_avail / mib:.1f} MiB of RAM available (MemAvailable"
                   f"{', from ' + MEMAVAIL_ENV if overridden else ''}) and this job holds "
                   f"{held / mib:.1f} MiB: {(need + ram_margin - ram_avail - held) / mib:.1f} MiB "
                   f"short")
