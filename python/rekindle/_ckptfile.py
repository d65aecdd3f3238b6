"""The checkpoint file of rekindle's store (docs/checkpoint.md): building its bytes and reading
and verifying one, as src/runtime/ckpt.c and src/base/safetensors.c do. The directory (saving,
retention, `latest`, the fallback, the lock) is rekindle.ckpt, which re-exports everything
public here; import that one."""

import json
import math
import os
import re
import stat
import sys

import xxhash

from .worker import STORAGE_ERRNOS

FORMAT = "rekindle-ckpt-1"
HEADER_MAX = 100_000_000  # bytes of JSON header, as the C reader (RK_ST_MAX_HEADER)
MAX_DIMS = 8
INT64_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1
FINITE_PREFIXES = ("model.", "optim.")  # floating items here must be finite
SCAN_CHUNK = 1 << 20  # elements per finite-values scan

DTYPE_SIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip

_MANIFEST_KEY = "xxh64.__manifest__"
_NAME_RE = re.compile(r"ckpt-([0-9]{12,19})\.safetensors\Z")
_HEX16 = re.compile(r"[0-9a-f]{16}\Z")


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
    bytes (C order, little-endian). After a load, `data` is a memoryview into the
    file's buffer."""

    __slots__ = ("name", "dtype", "shape", "data")

    def __init__(self, name, dtype, shape, data):
        self.name = name
        self.dtype = dtype
        self.shape = tuple(shape)
        self.data = data

    @property
    def nbytes(self):
        try:
            return memoryview(self.data).nbytes
        except TypeError:
            return -1

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


_FLOATS = {  # element size, exponent mask: all ones <=> NaN or infinity
    "F32": (4, 0x7F800000),
    "F64": (8, 0x7FF0000000000000),
    "F16": (2, 0x7C00),
    "BF16": (2, 0x7F80),
}


def nonfinite_index(dtype, data):
    """The index of the first NaN or infinity among `data`'s elements of floating `dtype`
    (F16, BF16, F32, F64, little-endian), None if there is none or the dtype is not one.

    Fast without numpy: the top byte of every element is copied out (one strided copy) and
    searched for the values a non-finite element's top byte has (0x7f and 0xff: exponent bits
    all ones; for F16 0x7c..0x7f, 0xfc..0xff); only those candidates, rare in real weights
    (finite ones there are above 2^127 in F32), are checked exactly."""
    if dtype not in _FLOATS:
        return None
    es, exp = _FLOATS[dtype]
    top = (exp >> (8 * (es - 1))) & 0xFF  # the exponent's bits in the top byte
    vals = [bytes([v]) for v in range(256) if v & top == top]
    mv = memoryview(data).cast("B")
    n = mv.nbytes // es
    for base in range(0, n, SCAN_CHUNK):
        chunk = bytes(mv[base * es : min(n, base + SCAN_CHUNK) * es])
        hi = chunk[es - 1 :: es]
        pos = misses = 0
        while True:
            found = [i for v in vals if (i := hi.find(v, pos)) >= 0]
            if not found:
                break
            i = min(found)
            if int.from_bytes(chunk[i * es : (i + 1) * es], "little") & exp == exp:
                return base + i
            misses += 1
            if misses > 64:  # many huge finite values: check every element of the chunk
                i = _exact_scan(chunk, es, exp)
                if i is not None:
                    return base + i
                break
            pos = i + 1
    return None


def _exact_scan(chunk, es, exp):
    """The first element of `chunk` whose exponent bits are all ones, None if none: per byte
    of the exponent, a translate to 0/1 flags; the flags ANDed as one big integer."""
    acc = None
    for k in range(es):
        m = (exp >> (8 * k)) & 0xFF
        if not m:
            continue
        tab = bytes(1 if b & m == m else 0 for b in range(256))
        flags = int.from_bytes(chunk[k::es].translate(tab), "little")
        acc = flags if acc is None else acc & flags
    if not acc:
        return None
    return ((acc & -acc).bit_length() - 1) // 8


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
        if mv.itemsize > 1 and _big_endian_format(mv.format):
            raise CheckpointError(f"{label}: item '{_show(name)}': data is big-endian (buffer "
                                  f"format '{_show(mv.format, 16)}'); checkpoints hold "
                                  "little-endian bytes")
        mv = mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv
        need = numel * DTYPE_SIZE[dtype]
        if mv.nbytes != need:
            raise CheckpointError(f"{label}: item '{_show(name)}': {mv.nbytes} bytes of data but "
                                  f"{dtype} {list(shape)} needs {need}")
        out.append((name, dtype, shape, mv))
    return out


def _big_endian_format(fmt):
    """A buffer format whose elements are big-endian: '>' or '!', or native on a big-endian
    machine (a bare format, '@', '=')."""
    first = fmt[:1]
    if first in (">", "!"):
        return True
    return first != "<" and sys.byteorder == "big"


def encode(step, items, *, epoch=0, cursor=0, world_size=1, config="{}", label="checkpoint"):
    """The checkpoint file's bytes as (header bytes, [data views]): what save() writes."""
    _check_int(label, "step", step, 0)
    _check_int(label, "epoch", epoch, 0)
    _check_int(label, "cursor", cursor, 0)
    _check_int(label, "world_size", world_size, 1, INT_MAX)
    if config is None:
        config = "{}"
    if isinstance(config, dict):
        try:
            config = json.dumps(config, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{label}: config cannot be written as JSON: {e}") from None
    if not isinstance(config, str):
        raise CheckpointError(f"{label}: config must be JSON text (str) or a dict")
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


def kind_name(mode):
    """What a file of `mode` is, for messages, as rk_file_kind_name says it."""
    return ("a regular file" if stat.S_ISREG(mode) else "a directory" if stat.S_ISDIR(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a symbolic link" if stat.S_ISLNK(mode) else "not a plain file")


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
        raise CheckpointError(f"{path}: is {kind_name(st.st_mode)}, not a regular file",
                              unreadable=True)
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


def _verify_header(L, meta, tensors, fname):
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
    named = None
    if isinstance(fname, (str, bytes, os.PathLike)):  # the real name: L may be cut for display
        named = name_step(os.path.basename(os.fsdecode(fname)))
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


def _finish(L, name, mv, hlen, size, parsed=None):
    meta, tensors = parsed or _parse_header(L, bytes(mv[8 : 8 + hlen]), size - 8 - hlen)
    sums = _verify_header(L, meta, tensors, name)
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
        hdr = _alloc(L, hlen)
        _read_exact_into(fd, memoryview(hdr), 8, L)
        # the header is checked before the data is read: a bogus one costs 8 + N bytes
        try:
            parsed = _parse_header(L, bytes(hdr), size - 8 - hlen)
        except MemoryError:
            raise _no_memory(L, hlen) from None
        buf = _alloc(L, size)
        buf[:8] = head
        buf[8 : 8 + hlen] = hdr
        del hdr
        _read_exact_into(fd, memoryview(buf)[8 + hlen :], 8 + hlen, L)
        if os.pread(fd, 1, size):
            raise CheckpointError(f"{L}: file grew while it was read")
    except OSError as e:
        raise _os_error(e, f"{L}: cannot read") from None
    finally:
        os.close(fd)
    return _finish(L, path, memoryview(buf), hlen, size, parsed)  # writable: the caller's copy


def _no_memory(L, n):
    # the C loader's RK_ENOMEM: the file may be fine, so the fallback stops here
    return CheckpointError(f"{L}: out of memory for {n} bytes", unreadable=True)


def _alloc(L, n):
    try:
        return bytearray(n)
    except MemoryError:
        raise _no_memory(L, n) from None


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
