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
wrong. Needs the `xxhash` module (Debian: python3-xxhash).
"""

import errno
import itertools
import json
import math
import os
import re
import stat
import threading
import time

import xxhash

from .worker import STORAGE_ERRNOS

FORMAT = "rekindle-ckpt-1"
LATEST = "latest"
LOCK_FILE = ".lock"
ASIDE_TAG = ".bad-"
HEADER_MAX = 100_000_000  # bytes of JSON header, as the C reader (RK_ST_MAX_HEADER)
LATEST_MAX = 4096  # bytes a `latest` file may have
MAX_DIMS = 8
INT64_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1
FINITE_PREFIXES = ("model.", "optim.")  # floating items here must be finite
WRITE_CHUNK = 32 << 20  # bytes per os.write
SCAN_CHUNK = 1 << 20  # elements per finite-values scan

DTYPE_SIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip

_MANIFEST_KEY = "xxh64.__manifest__"
_NAME_RE = re.compile(r"ckpt-([0-9]{12,19})\.safetensors\Z")
_HEX16 = re.compile(r"[0-9a-f]{16}\Z")
_tmp_counter = itertools.count()
_tmp_lock = threading.Lock()


class CheckpointError(Exception):
    """A checkpoint that is wrong, or a bad argument to save. `unreadable` is True when the file
    exists but could not be read at all (not a regular file, ...): the fallback of
    load_latest stops there instead of skipping it, as the C loader does."""

    def __init__(self, msg, *, unreadable=False):
        super().__init__(msg)
        self.unreadable = unreadable


class NonFiniteError(CheckpointError):
    """save() refused a NaN or an infinity in a model.* or optim.* floating item; nothing
    was written (rk train exits 5 for it: the numbers went wrong)."""


class LockedError(CheckpointError):
    """Another job holds the directory's lock; `holder` is its pid (0 if not written yet)."""

    def __init__(self, msg, holder=0):
        super().__init__(msg)
        self.holder = holder


class StorageError(OSError):
    """Storage refused a file (ENOSPC, EDQUOT, EROFS, EACCES, EPERM, EIO): the job cannot go on
    here (exit status 6). OSError's errno, strerror and filename are set; str() is the whole
    message."""

    def __init__(self, err, msg, filename=None):
        super().__init__(err, os.strerror(err), filename)
        self.msg = msg

    def __str__(self):
        return self.msg


def _os_error(e, what):
    """An OSError as StorageError (storage errnos) or CheckpointError, with `what` in front."""
    msg = f"{what}: {e.strerror or e}"
    if e.errno in STORAGE_ERRNOS:
        return StorageError(e.errno, msg, e.filename)
    return CheckpointError(msg, unreadable=True)


def _show(s, limit=80):
    """Untrusted text for a message: one line, control characters as '?', cut."""
    out = "".join("?" if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF
                  else c for c in str(s)[:limit])
    return out + ("..." if len(str(s)) > limit else "")


class Item:
    """One named tensor or blob: a safetensors dtype ("F32", "U8", ...), a shape tuple and its
    bytes (C order, little-endian). After a load, `data` is a read-only memoryview into the
    file's buffer."""

    __slots__ = ("name", "dtype", "shape", "data")

    def __init__(self, name, dtype, shape, data):
        self.name = name
        self.dtype = dtype
        self.shape = tuple(shape)
        self.data = data

    @property
    def nbytes(self):
        return memoryview(self.data).nbytes

    def __repr__(self):
        return f"Item({self.name!r}, {self.dtype!r}, {self.shape!r}, <{self.nbytes} bytes>)"

    def __eq__(self, other):
        return (isinstance(other, Item) and self.name == other.name and self.dtype == other.dtype
                and self.shape == other.shape and bytes(self.data) == bytes(other.data))


class Checkpoint:
    """A loaded, verified checkpoint: path, step, epoch, cursor, world_size, config (the JSON
    text, verbatim), items ({name: Item}, in data order), metadata (the whole __metadata__)."""

    def __init__(self, path, meta, items):
        self.path = path
        self.metadata = meta
        self.step = int(meta["step"])
        self.epoch = int(meta["epoch"])
        self.cursor = int(meta["cursor"])
        self.world_size = int(meta["world_size"])
        self.config = meta["config"]
        self.items = items

    def __getitem__(self, name):
        return self.items[name]

    def __contains__(self, name):
        return name in self.items

    def __repr__(self):
        return f"<Checkpoint {self.path} step {self.step}, {len(self.items)} items>"


# ---- names --------------------------------------------------------------------------------


def file_name(step):
    """"ckpt-<step as 12 digits>.safetensors" (more digits past 10^12)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"step {step!r} is not an integer >= 0")
    return f"ckpt-{step:012d}.safetensors"


def name_step(name):
    """The step of a checkpoint file name exactly as the store writes it, else None."""
    m = _NAME_RE.match(name)
    if not m:
        return None
    v = int(m.group(1))
    if v > INT64_MAX or f"ckpt-{v:012d}.safetensors" != name:
        return None
    return v


def _u63(s):
    """A canonical decimal ("0", "17": no sign, no leading zero) as int, else None."""
    if not 0 < len(s) <= 19 or (s[0] == "0" and len(s) > 1) or not s.isascii() or not s.isdigit():
        return None
    v = int(s)
    return v if v <= INT64_MAX else None


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


# ---- checks shared by save and load -------------------------------------------------------


def _check_text(s):
    """No NUL and no lone surrogate (what jansson refuses and UTF-8 cannot hold)."""
    return "\x00" not in s and not any(0xD800 <= ord(c) <= 0xDFFF for c in s)


def _no_constant(name):
    raise ValueError(f"'{name}' is not JSON")


def _json_int(s):
    v = int(s)
    if not -(1 << 63) <= v <= INT64_MAX:
        raise ValueError("an integer out of the 64-bit range")
    return v


def _json_float(s):
    v = float(s)
    if not math.isfinite(v):
        raise ValueError("a real number overflows")
    return v


def _pairs(kv):
    d = {}
    for k, v in kv:
        if k in d:
            raise ValueError(f"duplicate key '{_show(k)}'")
        d[k] = v
    return d


def _strings_ok(v):
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            if not _check_text(x):
                return False
        elif isinstance(x, dict):
            for k, y in x.items():
                if not _check_text(k):
                    return False
                stack.append(y)
        elif isinstance(x, list):
            stack.extend(x)
    return True


def _json_loads(text, duplicates=False):
    """JSON as jansson reads it (no NaN/Infinity, 64-bit integers, no NUL or bad surrogates in
    strings; with duplicates=False a key twice is an error). ValueError otherwise."""
    try:
        v = json.loads(text, parse_constant=_no_constant, parse_int=_json_int,
                       parse_float=_json_float, object_pairs_hook=None if duplicates else _pairs)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if not _strings_ok(v):
        raise ValueError("a string holds a NUL or an invalid surrogate")
    return v


def nonfinite_index(dtype, data):
    """The index of the first NaN or infinity among `data`'s elements of floating `dtype`
    (F16, BF16, F32, F64, little-endian), None if there is none or the dtype is not one."""
    masks = {  # (element size, [(byte offset, mask)]): exponent all ones <=> non-finite
        "F32": (4, [(3, 0x7F), (2, 0x80)]),
        "F64": (8, [(7, 0x7F), (6, 0xF0)]),
        "F16": (2, [(1, 0x7C)]),
        "BF16": (2, [(1, 0x7F), (0, 0x80)]),
    }
    if dtype not in masks:
        return None
    es, parts = masks[dtype]
    mv = memoryview(data).cast("B")
    n = mv.nbytes // es
    tables = [bytes(1 if b & m == m else 0 for b in range(256)) for _, m in parts]
    for base in range(0, n, SCAN_CHUNK):
        end = min(n, base + SCAN_CHUNK)
        chunk = mv[base * es : end * es]
        acc = None
        for (off, _), tab in zip(parts, tables):
            flags = int.from_bytes(bytes(chunk[off::es]).translate(tab), "little")
            acc = flags if acc is None else acc & flags
        if acc:
            return base + ((acc & -acc).bit_length() - 1) // 8
    return None


def nonfinite_name(dtype, data, index):
    es = DTYPE_SIZE[dtype]
    v = int.from_bytes(bytes(memoryview(data).cast("B")[index * es : (index + 1) * es]), "little")
    mant = {"F32": 0x7FFFFF, "F64": (1 << 52) - 1, "F16": 0x3FF, "BF16": 0x7F}[dtype]
    if v & mant:
        return "NaN"
    return "-inf" if v >> (8 * es - 1) else "+inf"


def must_be_finite(name):
    return name.startswith(FINITE_PREFIXES)


def _manifest_hash(meta, tensors):
    """XXH64 of the manifest text: metadata entries but the manifest's own by key in byte
    order, "key\\0value\\0"; then tensors in data order, "name\\0dtype\\0d1,d2\\0begin\\0end\\0"."""
    h = xxhash.xxh64(seed=0)
    for k in sorted(meta, key=lambda s: s.encode("utf-8")):
        if k == _MANIFEST_KEY:
            continue
        h.update(k.encode("utf-8") + b"\0" + meta[k].encode("utf-8") + b"\0")
    for name, dtype, shape, begin, end in tensors:
        dims = ",".join(str(d) for d in shape)
        h.update(f"{name}\0{dtype}\0{dims}\0{begin}\0{end}\0".encode("utf-8"))
    return h.hexdigest()


# ---- saving -------------------------------------------------------------------------------


_verified = {}  # (dev, ino, size, mtime_ns) of files this process wrote or verified
_VERIFIED_MAX = 64


def _key(st):
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _verified_add(path):
    try:
        k = _key(os.stat(path))
    except OSError:
        return
    if len(_verified) >= _VERIFIED_MAX:
        _verified.pop(next(iter(_verified)))
    _verified[k] = True


def _verify_cached(path):
    """Written or verified by this process and unchanged since, or verified now."""
    try:
        if _key(os.stat(path)) in _verified:
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
    def __init__(self, path):
        self.path = path
        self.dir = os.path.dirname(path) or "."
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
                off += os.write(self.fd, mv[off : off + WRITE_CHUNK])
        except OSError as e:
            raise _os_error(e, f"{self.tmp}: cannot write") from None

    def commit(self, before_rename=None):
        try:
            os.fsync(self.fd)
        except OSError as e:
            raise _os_error(e, f"{self.tmp}: cannot fsync") from None
        os.close(self.fd)
        self.fd = -1
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
            os.close(self.fd)
            self.fd = -1
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


def _check_int(label, what, v, lo, hi=INT64_MAX):
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise CheckpointError(f"{label}: {what} {v!r} is not an integer in {lo}..{hi}")
    return v


def _plan(label, items):
    """Checked items: [(name, dtype, shape, memoryview of bytes)]."""
    out = []
    seen = set()
    for i, it in enumerate(items):
        name, dtype, shape, data = it.name, it.dtype, it.shape, it.data
        if not isinstance(name, str) or not name:
            raise CheckpointError(f"{label}: item #{i} has no name")
        if not _check_text(name):
            raise CheckpointError(f"{label}: item '{_show(name)}': the name holds a NUL or an "
                                  "invalid surrogate")
        if name in ("__manifest__", "__metadata__"):
            raise CheckpointError(f"{label}: item '{name}': the name is reserved")
        if name in seen:
            raise CheckpointError(f"{label}: item name '{_show(name)}' appears twice")
        seen.add(name)
        if dtype is None:
            dtype = "F32"
        if dtype not in DTYPE_SIZE:
            raise CheckpointError(f"{label}: item '{_show(name)}': unknown dtype '{_show(dtype, 16)}'")
        shape = tuple(shape)
        if len(shape) > MAX_DIMS:
            raise CheckpointError(f"{label}: item '{_show(name)}': {len(shape)} dimensions, more "
                                  f"than {MAX_DIMS}")
        numel = 1
        for k, dim in enumerate(shape):
            if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0 or dim > INT64_MAX:
                raise CheckpointError(f"{label}: item '{_show(name)}': shape[{k}] is {dim!r}")
            numel *= dim
        try:
            mv = memoryview(data)
        except TypeError:
            raise CheckpointError(f"{label}: item '{_show(name)}': data is not bytes-like "
                                  f"({type(data).__name__})") from None
        if not mv.c_contiguous:
            raise CheckpointError(f"{label}: item '{_show(name)}': data is not C-contiguous")
        mv = mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv
        need = numel * DTYPE_SIZE[dtype]
        if mv.nbytes != need:
            raise CheckpointError(f"{label}: item '{_show(name)}': {mv.nbytes} bytes of data but "
                                  f"{dtype} {list(shape)} needs {need}")
        out.append((name, dtype, shape, mv))
    return out


def encode(step, items, *, epoch=0, cursor=0, world_size=1, config="{}", label="checkpoint"):
    """The checkpoint file's bytes as (header bytes, [data views]): what save() writes."""
    _check_int(label, "step", step, 0)
    _check_int(label, "epoch", epoch, 0)
    _check_int(label, "cursor", cursor, 0)
    _check_int(label, "world_size", world_size, 1, INT_MAX)
    if config is None:
        config = "{}"
    if not isinstance(config, str):
        raise CheckpointError(f"{label}: config must be JSON text (str)")
    try:
        _json_loads(config, duplicates=True)
    except ValueError as e:
        raise CheckpointError(f"{label}: config is not valid JSON: {e}") from None
    plan = _plan(label, items)
    meta = {"format": FORMAT, "step": str(step), "epoch": str(epoch), "cursor": str(cursor),
            "world_size": str(world_size), "config": config}
    tensors = []
    off = 0
    for name, dtype, shape, mv in plan:
        meta["xxh64." + name] = xxhash.xxh64(mv, seed=0).hexdigest()
        if must_be_finite(name):
            bad = nonfinite_index(dtype, mv)
            if bad is not None:
                raise NonFiniteError(
                    f"{label}: item '{_show(name)}': element {bad} is "
                    f"{nonfinite_name(dtype, mv, bad)}; weights and optimiser state (model.*, "
                    "optim.*) must be finite: not saved")
        tensors.append((name, dtype, shape, off, off + mv.nbytes))
        off += mv.nbytes
    meta[_MANIFEST_KEY] = _manifest_hash(meta, tensors)
    header = {"__metadata__": meta}
    for name, dtype, shape, b, e in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [b, e]}
    js = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    padded = (len(js) + 7) & ~7
    if padded > HEADER_MAX:
        raise CheckpointError(f"{label}: header would be {padded} bytes, over the limit of "
                              f"{HEADER_MAX}")
    hdr = padded.to_bytes(8, "little") + js + b" " * (padded - len(js))
    return hdr, [mv for _, _, _, mv in plan]


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


def _open_regular(path, limit=None):
    """An fd and the size of `path`, a regular file (O_NONBLOCK: a FIFO does not block)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise _os_error(e, f"{path}: cannot open") from None
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise _os_error(e, f"{path}: cannot stat") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a character device" if stat.S_ISCHR(st.st_mode) else "a block device"
                if stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "not a plain file")
        raise CheckpointError(f"{path}: is {kind}, not a regular file", unreadable=True)
    if limit is not None and st.st_size > limit:
        os.close(fd)
        raise CheckpointError(f"{path}: file is {st.st_size} bytes, more than the limit of {limit}")
    return fd, st.st_size


def _parse_entry(L, name, val, data_len):
    nm = _show(name)
    if not isinstance(val, dict):
        raise CheckpointError(f"{L}: tensor '{nm}': entry is not a JSON object")
    for k in val:
        if k not in ("dtype", "shape", "data_offsets"):
            raise CheckpointError(f"{L}: tensor '{nm}': unknown field '{_show(k, 60)}'")
    if "dtype" not in val:
        raise CheckpointError(f"{L}: tensor '{nm}': missing field 'dtype'")
    dtype = val["dtype"]
    if not isinstance(dtype, str):
        raise CheckpointError(f"{L}: tensor '{nm}': 'dtype' is not a string")
    if dtype not in DTYPE_SIZE:
        raise CheckpointError(f"{L}: tensor '{nm}': unknown dtype '{_show(dtype, 60)}'")
    if "shape" not in val:
        raise CheckpointError(f"{L}: tensor '{nm}': missing field 'shape'")
    shape = val["shape"]
    if not isinstance(shape, list):
        raise CheckpointError(f"{L}: tensor '{nm}': 'shape' is not an array")
    if len(shape) > MAX_DIMS:
        raise CheckpointError(f"{L}: tensor '{nm}': 'shape' has {len(shape)} dimensions, more "
                              f"than {MAX_DIMS}")
    numel = 1
    for i, dim in enumerate(shape):
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise CheckpointError(f"{L}: tensor '{nm}': 'shape'[{i}] is not a non-negative integer")
        numel *= dim
        if numel >= 1 << 64:
            raise CheckpointError(f"{L}: tensor '{nm}': 'shape' element count overflows")
    need = numel * DTYPE_SIZE[dtype]
    if need >= 1 << 64:
        raise CheckpointError(f"{L}: tensor '{nm}': 'shape' byte size overflows")
    if "data_offsets" not in val:
        raise CheckpointError(f"{L}: tensor '{nm}': missing field 'data_offsets'")
    offs = val["data_offsets"]
    if not isinstance(offs, list) or len(offs) != 2:
        raise CheckpointError(f"{L}: tensor '{nm}': 'data_offsets' is not an array of two integers")
    b, e = offs
    if any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in (b, e)):
        raise CheckpointError(f"{L}: tensor '{nm}': 'data_offsets' are not non-negative integers")
    if b > e:
        raise CheckpointError(f"{L}: tensor '{nm}': 'data_offsets' begin {b} is after end {e}")
    if e > data_len:
        raise CheckpointError(f"{L}: tensor '{nm}': 'data_offsets' end {e} is past the end of the "
                              f"data section ({data_len} bytes)")
    if e - b != need:
        raise CheckpointError(f"{L}: tensor '{nm}': 'data_offsets' span {e - b} bytes but {dtype} "
                              f"[{','.join(map(str, shape))}] needs {need}")
    return (name, dtype, tuple(shape), b, e)


class _Pairs(list):
    """A JSON object as parsed: its (key, value) pairs in order, duplicates kept."""


def _plain(v, L, where):
    """Parsed JSON with _Pairs turned into dicts: a key twice, a NUL or a lone surrogate in a
    string are CheckpointError."""
    if isinstance(v, _Pairs):
        d = {}
        for k, x in v:
            if k in d:
                raise CheckpointError(f"{L}: duplicate key in header: '{_show(k)}' appears twice"
                                      f"{where}")
            if not _check_text(k):
                raise CheckpointError(f"{L}: header is not valid JSON: a string holds a NUL or "
                                      "an invalid surrogate")
            d[k] = _plain(x, L, where)
        return d
    if isinstance(v, list):
        return [_plain(x, L, where) for x in v]
    if isinstance(v, str) and not _check_text(v):
        raise CheckpointError(f"{L}: header is not valid JSON: a string holds a NUL or an "
                              "invalid surrogate")
    return v


def _parse_header(L, h, data_len):
    """(metadata dict, tensors [(name, dtype, shape, begin, end)] in data order)."""
    if h[:1] != b"{":
        raise CheckpointError(f"{L}: header is not a JSON object (no '{{' at byte 8)")
    try:
        text = h.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{L}: header is not valid UTF-8 (byte {8 + e.start})") from None
    try:
        top = json.loads(text, parse_constant=_no_constant, parse_int=_json_int,
                         parse_float=_json_float, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{L}: header is not valid JSON: {e.msg} (byte {8 + e.pos})") from None
    except RecursionError:
        raise CheckpointError(f"{L}: header is not valid JSON: nested too deeply") from None
    except ValueError as e:
        raise CheckpointError(f"{L}: header is not valid JSON: {e}") from None
    if not isinstance(top, _Pairs):
        raise CheckpointError(f"{L}: header is not a JSON object")
    meta = None
    tensors = []
    names = set()
    try:
        for key, val in top:
            if not _check_text(key):
                raise CheckpointError(f"{L}: header is not valid JSON: a string holds a NUL or "
                                      "an invalid surrogate")
            if key == "__metadata__":
                if meta is not None:
                    raise CheckpointError(f"{L}: duplicate key in header: '__metadata__' appears "
                                          "twice")
                val = _plain(val, L, " in '__metadata__'")
                if not isinstance(val, dict):
                    raise CheckpointError(f"{L}: '__metadata__' is not a JSON object")
                for k, v in val.items():
                    if not isinstance(v, str):
                        raise CheckpointError(f"{L}: '__metadata__': value of '{_show(k)}' is not "
                                              "a string")
                meta = val
                continue
            if key in names:
                raise CheckpointError(f"{L}: duplicate key in header: tensor '{_show(key)}' "
                                      "appears twice")
            names.add(key)
            entry = _plain(val, L, f" in tensor '{_show(key)}'")
            tensors.append(_parse_entry(L, key, entry, data_len))
    except RecursionError:
        raise CheckpointError(f"{L}: header is not valid JSON: nested too deeply") from None
    tensors.sort(key=lambda t: (t[3], t[4] - t[3], t[0].encode("utf-8")))
    expect = 0
    for i, t in enumerate(tensors):
        if t[3] < expect:
            raise CheckpointError(f"{L}: tensors '{_show(tensors[i - 1][0])}' and '{_show(t[0])}' "
                                  "overlap")
        if t[3] > expect:
            raise CheckpointError(f"{L}: tensor '{_show(t[0])}': hole in the data section, bytes "
                                  f"{expect}..{t[3]} belong to no tensor")
        expect = t[4]
    if expect != data_len:
        raise CheckpointError(f"{L}: data section is {data_len} bytes but the tensors cover only "
                              f"{expect}")
    return (meta or {}), tensors


def _field(L, meta, key, hi=INT64_MAX):
    s = meta.get(key)
    if s is None:
        raise CheckpointError(f"{L}: field '{key}' is missing from '__metadata__'")
    v = _u63(s)
    if v is None or v > hi:
        raise CheckpointError(f"{L}: field '{key}' is '{_show(s)}', not an integer in 0..{hi}")
    return v


def _verify_header(L, meta, tensors):
    fmt = meta.get("format")
    if fmt is None:
        raise CheckpointError(f"{L}: not a rekindle checkpoint: field 'format' is missing from "
                              "'__metadata__'")
    if fmt != FORMAT:
        raise CheckpointError(f"{L}: field 'format' is '{_show(fmt)}', expected '{FORMAT}'")
    names = set()
    sums = []
    for name, *_ in tensors:
        if not name or name == "__manifest__":
            raise CheckpointError(f"{L}: tensor '{_show(name)}': the name is empty or reserved")
        names.add(name)
        s = meta.get("xxh64." + name)
        if s is None:
            raise CheckpointError(f"{L}: tensor '{_show(name)}' has no checksum (field "
                                  f"'xxh64.{_show(name)}' is missing)")
        if not _HEX16.match(s):
            raise CheckpointError(f"{L}: tensor '{_show(name)}': field 'xxh64.{_show(name)}' is "
                                  f"'{_show(s)}', not 16 hex digits")
        sums.append(s)
    for k in meta:
        if k.startswith("xxh64.") and k != _MANIFEST_KEY and k[6:] not in names:
            raise CheckpointError(f"{L}: tensor '{_show(k[6:])}' is missing (field '{_show(k)}' "
                                  "lists its checksum)")
    step = _field(L, meta, "step")
    _field(L, meta, "epoch")
    _field(L, meta, "cursor")
    if _field(L, meta, "world_size", INT_MAX) < 1:
        raise CheckpointError(f"{L}: field 'world_size' is 0")
    if "config" not in meta:
        raise CheckpointError(f"{L}: field 'config' is missing from '__metadata__'")
    try:
        _json_loads(meta["config"], duplicates=True)
    except ValueError as e:
        raise CheckpointError(f"{L}: field 'config' is not valid JSON: {_show(e)}") from None
    named = name_step(os.path.basename(L))
    if named is not None and named != step:
        raise CheckpointError(f"{L}: field 'step' is {step} but the file name says {named}")
    mh = meta.get(_MANIFEST_KEY)
    if mh is None:
        raise CheckpointError(f"{L}: field '{_MANIFEST_KEY}' is missing from '__metadata__'")
    if not _HEX16.match(mh):
        raise CheckpointError(f"{L}: field '{_MANIFEST_KEY}' is '{_show(mh)}', not 16 hex digits")
    got = _manifest_hash(meta, tensors)
    if got != mh:
        raise CheckpointError(f"{L}: field '{_MANIFEST_KEY}' does not match: '__metadata__' or the "
                              f"tensor table changed after writing (stored {mh}, computed {got})")
    return sums


def parse(buf, name="<memory>"):
    """A checkpoint from its bytes (`name` labels messages and its step is checked against the
    name's, as for a file). CheckpointError naming what is wrong."""
    L = _show(name, 400)
    mv = memoryview(buf).cast("B").toreadonly()
    size = mv.nbytes
    if size < 8:
        raise CheckpointError(f"{L}: file is {size} bytes, shorter than the 8-byte header length")
    hlen = int.from_bytes(mv[:8], "little")
    _check_hlen(L, hlen, size)
    return _finish(L, name, mv, hlen, size)


def _check_hlen(L, hlen, size):
    if hlen > HEADER_MAX:
        raise CheckpointError(f"{L}: header length is over the limit of {HEADER_MAX} bytes (not a "
                              "safetensors file?)")
    if hlen > size - 8:
        raise CheckpointError(f"{L}: header length runs past the end of the file ({size} bytes)")
    if hlen == 0:
        raise CheckpointError(f"{L}: header length is 0")


def _finish(L, name, mv, hlen, size):
    meta, tensors = _parse_header(L, bytes(mv[8 : 8 + hlen]), size - 8 - hlen)
    sums = _verify_header(L, meta, tensors)
    base = 8 + hlen
    items = {}
    for (tname, dtype, shape, b, e), stored in zip(tensors, sums):
        data = mv[base + b : base + e]
        got = xxhash.xxh64(data, seed=0).hexdigest()
        if got != stored:
            raise CheckpointError(f"{L}: tensor '{_show(tname)}': data checksum mismatch (stored "
                                  f"{stored}, computed {got} over {e - b} bytes)")
        if must_be_finite(tname):
            bad = nonfinite_index(dtype, data)
            if bad is not None:
                raise CheckpointError(f"{L}: tensor '{_show(tname)}': element {bad} is "
                                      f"{nonfinite_name(dtype, data, bad)} (weights and optimiser "
                                      "state must be finite)")
        items[tname] = Item(tname, dtype, shape, data)
    return Checkpoint(name, meta, items)


def load(path):
    """Load and verify one checkpoint file. Reads at most 8 + the header's length before the
    header is checked against the file's size; regular files only. CheckpointError naming the
    file and the tensor or field (also for a missing file); StorageError when it cannot be read
    for a permission or an I/O error."""
    path = os.fspath(path)
    L = _show(path, 400)
    try:
        fd, size = _open_regular(path)
    except FileNotFoundError:
        raise CheckpointError(f"{L}: does not exist") from None
    try:
        if size < 8:
            raise CheckpointError(f"{L}: file is {size} bytes, shorter than the 8-byte header "
                                  "length")
        head = bytearray(8)
        _read_exact_into(fd, memoryview(head), 0, L)
        hlen = int.from_bytes(head, "little")
        _check_hlen(L, hlen, size)
        buf = bytearray(size)
        buf[:8] = head
        hdr = memoryview(buf)[8 : 8 + hlen]
        _read_exact_into(fd, hdr, 8, L)
        # the header is checked before the data is read: a bogus one costs 8 + N bytes
        meta, tensors = _parse_header(L, bytes(hdr), size - 8 - hlen)
        _read_exact_into(fd, memoryview(buf)[8 + hlen :], 8 + hlen, L)
        extra = os.pread(fd, 1, size)
        if extra:
            raise CheckpointError(f"{L}: file grew while it was read")
    except OSError as e:
        raise _os_error(e, f"{L}: cannot read") from None
    finally:
        os.close(fd)
    del meta, tensors
    return _finish(L, path, memoryview(buf).toreadonly(), hlen, size)


def _read_exact_into(fd, mv, off, L):
    got = 0
    n = mv.nbytes
    while got < n:
        try:
            r = os.preadv(fd, [mv[got:]], off + got)
        except OSError as e:
            raise _os_error(e, f"{L}: cannot read") from None
        if r == 0:
            raise CheckpointError(f"{L}: file shrank while it was read")
        got += r


def verify(path):
    """True when load(path) would succeed; never raises for a bad file."""
    try:
        load(path)
        return True
    except (CheckpointError, OSError):
        return False


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


def load_latest(dir):
    """The newest checkpoint of `dir` that verifies, by the C loader's rule: the one `latest`
    names, else every checkpoint from the highest step down. Returns (Checkpoint or None,
    skipped): one line per file skipped and per problem with `latest`. A file that exists but
    cannot be read (permissions, I/O, not a regular file) stops the search: StorageError or
    CheckpointError (its content may be the run's newest work). A missing directory: (None, [])."""
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
            c = load(os.path.join(d, lname))
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
            return load(os.path.join(d, n)), report
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
    ck = env.get("RK_CKPT_DIR")
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
            raw = os.pread(fd, 32, 0).split(b"\n")[0]
            pid = _u63(raw.decode("ascii", "replace")) or 0
            if pid > INT_MAX:
                pid = 0
            who = f"pid {pid} holds {path}" if pid else f"it holds {path}, its pid not written yet"
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
