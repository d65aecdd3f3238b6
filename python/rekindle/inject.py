"""RK_INJECT, the fault spec of `rk run` (docs/inject.md), in Python: the same grammar and the
same error messages as the C parser (src/runtime/inject.c; positions are 1-based byte
positions), and an Injector that says which faults fire at a step on this rank.

    spec   := fault (',' ' '* fault)*      spaces are allowed after a comma and nowhere else
    fault  := kind '@' param (':' param)*
    kind   := crash | hang | nan | bitflip | gradflip | slow | commfail
    param  := step=INT | mtbf=DUR | rank=INT | seed=UINT64 | ms=INT | for=INT

The library decides only when a fault fires; the caller (rekindle.torch) does the damage, after
announcing it with Worker.inject(step, fault.index, fault.kind).

Random (mtbf) faults: exponential gaps with mean mtbf, in seconds since the Injector was made,
drawn as the C runtime draws them (rekindle/rng.h: xoshiro256** seeded through splitmix64 from
(seed, index << 32 | rank, launch); -mtbf * log1p(-u) with u from 53 random bits), so a spec,
rank and launch give the same arrival times in Python as in C. A rank started again in place
(RK_REJOIN_EPOCH=E, docs/recovery.md "In place") is a new process of the same rank and launch:
its stream is (seed, index << 32 | rank, launch | E << 32), so that it does not replay its
predecessor's arrivals (an early one would otherwise end every replacement at the same age).
"""

import math
import os
import struct
import time

SPEC_MAX = 4096
MAX_FAULTS = 256
MAX_RANK = 65535
MAX_STEP = 1 << 62
MAX_MTBF_S = 1e9
SLOW_MS_DEFAULT = 100
SLOW_MS_MAX = 600000
SEED_DEFAULT = 1
KINDS = ("crash", "hang", "nan", "bitflip", "gradflip", "slow", "commfail")
KEYS = ("step", "rank", "mtbf", "seed", "ms", "for")
_KINDS_EXPECTED = "crash, hang, nan, bitflip, gradflip, slow, commfail"
_KEYS_EXPECTED = "step, rank, mtbf, seed, ms, for"
_UNITS = {b"": 1.0, b"s": 1.0, b"m": 60.0, b"h": 3600.0, b"ms": None}
_QUOTE_BYTES = 40


class Fault:
    """One parsed fault: kind, index (its position in the spec), step (-1 for a random one),
    mtbf_s (0.0 for a fixed one), rank (-1: every rank, only for an mtbf fault without rank=),
    seed (0 for a fixed one), ms (slow only, else 0), for_ (slow: steps it lasts, 0 = until the
    end)."""

    __slots__ = ("kind", "index", "step", "mtbf_s", "rank", "seed", "ms", "for_")

    def __init__(self, kind, index, step, mtbf_s, rank, seed, ms, for_):
        self.kind, self.index, self.step, self.mtbf_s = kind, index, step, mtbf_s
        self.rank, self.seed, self.ms, self.for_ = rank, seed, ms, for_

    @property
    def random(self):
        return self.step < 0

    def _t(self):
        return (self.kind, self.index, self.step, self.mtbf_s, self.rank, self.seed, self.ms,
                self.for_)

    def __eq__(self, other):
        return isinstance(other, Fault) and self._t() == other._t()

    def __hash__(self):
        return hash(self._t())

    def __repr__(self):
        return ("Fault(kind={!r}, index={}, step={}, mtbf_s={!r}, rank={}, seed={}, ms={}, "
                "for_={})".format(*self._t()))


def quote(b):
    """Spec text for a message: printable ASCII as is, ' and \\ escaped, other bytes \\xNN,
    cut after 40 bytes with '...'."""
    out = []
    for c in b[:_QUOTE_BYTES]:
        if c in (0x27, 0x5C):
            out.append("\\" + chr(c))
        elif 0x20 <= c < 0x7F:
            out.append(chr(c))
        else:
            out.append(f"\\x{c:02x}")
    if len(b) > _QUOTE_BYTES:
        out.append("...")
    return "".join(out)


class _Fail(Exception):
    pass


def _fail(at, what):
    raise _Fail(f"fault spec: position {at + 1}: {what}")


def _cspn(s, p, stop):
    i = p
    while i < len(s) and s[i] not in stop:
        i += 1
    return i - p


def _digits(b):
    """(1, value) for decimal digits, (0, None) for no digits or a non-digit, (-1, None) above
    2^64-1 (the C parser's digits_value)."""
    if not b or not all(0x30 <= c <= 0x39 for c in b):
        return 0, None
    v = int(b)
    return (1, v) if v <= (1 << 64) - 1 else (-1, None)


def _parse_int(at, b, key, lo, hi):
    r, v = _digits(b)
    if r == 0:
        _fail(at, f"bad value '{quote(b)}' for {key} (expected a decimal integer {lo}..{hi})")
    if r < 0 or v < lo or v > hi:
        _fail(at, f"{key}={quote(b)} is out of range ({lo}..{hi})")
    return v


def _parse_dur(at, b):
    i = 0
    while i < len(b) and 0x30 <= b[i] <= 0x39:
        i += 1
    ok = i > 0
    if ok and i < len(b) and b[i] == 0x2E:
        i += 1
        f = i
        while i < len(b) and 0x30 <= b[i] <= 0x39:
            i += 1
        ok = i > f
    num, unit = b[:i], b[i:]
    if not ok or unit not in _UNITS:
        _fail(at, f"bad value '{quote(b)}' for mtbf (expected a number with optional unit ms, s, m "
                  "or h, as in mtbf=120s)")
    intpart, _, frac = num.partition(b".")
    x = float(f"{(intpart + frac).decode()}e-{len(frac)}")  # correctly rounded, as strtod
    mult = _UNITS[unit]
    v = x / 1000.0 if mult is None else (x * mult if mult != 1.0 else x)
    if not (v > 0.0 and v <= MAX_MTBF_S):
        _fail(at, f"mtbf={quote(b)} is out of range (above 0, at most 1e9 seconds)")
    return v


def _parse_fault(s, p, index):
    start = p
    klen = _cspn(s, p, b"@,:=")
    if klen == 0:
        _fail(p, f"missing fault kind (expected {_KINDS_EXPECTED})")
    kb = s[p : p + klen]
    kind = kb.decode("latin-1")
    if kind not in KINDS:
        _fail(p, f"unknown fault kind '{quote(kb)}' (expected {_KINDS_EXPECTED})")
    p += klen
    if p >= len(s) or s[p] != 0x40:
        _fail(p, f"expected '@' after '{kind}' (as in {kind}@step=100)")
    p += 1
    seen = {}
    val = {}
    while True:
        kat = p
        n = _cspn(s, p, b"=:,")
        if n == 0:
            _fail(p, f"missing key (expected {_KEYS_EXPECTED})")
        keyb = s[p : p + n]
        key = keyb.decode("latin-1")
        if key not in KEYS:
            _fail(p, f"unknown key '{quote(keyb)}' (expected {_KEYS_EXPECTED})")
        p += n
        if p >= len(s) or s[p] != 0x3D:
            _fail(p, f"expected '=' after '{key}'")
        if key in seen:
            _fail(kat, f"duplicate key '{key}'")
        if key in ("ms", "for") and kind != "slow":
            _fail(kat, f"key '{key}' is only allowed for slow, not {kind}")
        if (key == "step" and "mtbf" in seen) or (key == "mtbf" and "step" in seen):
            _fail(kat, "step= and mtbf= exclude each other (a fault is either at a step or random)")
        seen[key] = kat
        p += 1
        vlen = _cspn(s, p, b":,")
        if vlen == 0:
            _fail(p, f"empty value for '{key}'")
        vb = s[p : p + vlen]
        if key == "step":
            val[key] = _parse_int(p, vb, key, 0, MAX_STEP)
        elif key == "rank":
            val[key] = _parse_int(p, vb, key, 0, MAX_RANK)
        elif key == "seed":
            val[key] = _parse_int(p, vb, key, 0, (1 << 64) - 1)
        elif key == "ms":
            val[key] = _parse_int(p, vb, key, 1, SLOW_MS_MAX)
        elif key == "for":
            val[key] = _parse_int(p, vb, key, 1, MAX_STEP)
        else:
            val[key] = _parse_dur(p, vb)
        p += vlen
        if p >= len(s) or s[p] != 0x3A:
            break
        p += 1
    if "step" not in seen and "mtbf" not in seen:
        _fail(start, f"{kind} fault needs step= or mtbf=")
    if "seed" in seen and "mtbf" not in seen:
        _fail(seen["seed"], "seed= is only allowed with mtbf= (a step= fault is not random)")
    rnd = "mtbf" in seen
    f = Fault(
        kind=kind,
        index=index,
        step=-1 if rnd else val["step"],
        mtbf_s=val["mtbf"] if rnd else 0.0,
        rank=val["rank"] if "rank" in seen else (-1 if rnd else 0),
        seed=(val.get("seed", SEED_DEFAULT) if rnd else 0),
        ms=(val.get("ms", SLOW_MS_DEFAULT) if kind == "slow" else 0),
        for_=val.get("for", 0),
    )
    return f, p


def parse(text):
    """The faults of a spec (str or bytes; None or "" is no fault) as a list of Fault.
    ValueError with the C parser's message ("fault spec: position P: ...") otherwise. A spec
    ends at a NUL byte, as the C string does."""
    if text is None:
        return []
    s = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else bytes(text)
    nul = s.find(b"\0")
    if nul >= 0:
        s = s[:nul]
    if not s:
        return []
    try:
        if len(s) > SPEC_MAX:
            _fail(SPEC_MAX, f"spec is longer than {SPEC_MAX} bytes")
        faults = []
        p = 0
        while True:
            if len(faults) >= MAX_FAULTS:
                _fail(p, f"more than {MAX_FAULTS} faults")
            f, p = _parse_fault(s, p, len(faults))
            faults.append(f)
            if p >= len(s):
                break
            p += 1  # the ','
            while p < len(s) and s[p] == 0x20:
                p += 1
        return faults
    except _Fail as e:
        raise ValueError(str(e)) from None


def parse_done(text, n):
    """The indices of a done list ("0,3"; spaces after commas, repeats allowed) as a set, each
    below n. ValueError like the C runtime's ("fault done list '...': position P: ...")."""
    if not text:
        return set()
    s = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else bytes(text)
    out = set()
    p = 0
    while True:
        ln = _cspn(s, p, b",")
        item = s[p : p + ln]
        r, v = _digits(item)
        if r != 1 or v >= n:
            what = "missing fault index" if ln == 0 else "bad fault index"
            tail = "(the spec has no faults)" if n == 0 else f"(expected 0..{n - 1})"
            raise ValueError(f"fault done list '{quote(s)}': position {p + 1}: {what} "
                             f"'{quote(item)}' {tail}")
        out.add(v)
        p += ln
        if p >= len(s):
            return out
        p += 1
        while p < len(s) and s[p] == 0x20:
            p += 1


_M64 = (1 << 64) - 1


def _splitmix64(x):
    """(new state, output) of splitmix64."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return x, z ^ (z >> 31)


class Rng:
    """rekindle's rng (src/base/rng.c): xoshiro256** with splitmix64 seeding."""

    def __init__(self, seed):
        x = seed & _M64
        self.s = []
        for _ in range(4):
            x, v = _splitmix64(x)
            self.s.append(v)

    @classmethod
    def derive(cls, seed, a, b):
        """The stream of (seed, a, b), as rk_rng_derive."""
        x, h = _splitmix64(seed & _M64)
        x, h = _splitmix64(h ^ ((a * 0xD6E8FEB86659FD93) & _M64))
        x, h = _splitmix64(h ^ ((b * 0xA0761D6478BD642F) & _M64))
        return cls(h)

    def next(self):
        s = self.s
        r = (((((s[1] * 5) & _M64) << 7 | ((s[1] * 5) & _M64) >> 57) & _M64) * 9) & _M64
        t = (s[1] << 17) & _M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = ((s[3] << 45) | (s[3] >> 19)) & _M64
        return r

    def exponential(self, mean):
        """An exponential draw with mean `mean` from 53 random bits, as the C runtime's."""
        u = (self.next() >> 11) * 2.0**-53
        return -mean * math.log1p(-u)


class Injector:
    """The faults of a spec armed for one rank in one launch. due(step) returns, in index order,
    the faults that fire now: a step= fault once, at its step; an mtbf= fault whenever its next
    arrival (seconds since the Injector was made, or `clock`) has passed, at most once per call.
    Faults in the done list (RK_INJECT_DONE: fired in earlier launches) never fire."""

    def __init__(self, spec, rank, launch=0, done=None, clock=time.monotonic, epoch=0):
        self.faults = parse(spec) if isinstance(spec, (str, bytes, type(None))) else list(spec)
        if not 0 <= rank <= MAX_RANK:
            raise ValueError(f"fault injection: rank {rank} is outside 0..{MAX_RANK}")
        self.rank = rank
        self.launch = launch
        self.epoch = epoch  # > 0: a rank started again in place, in that rendezvous epoch
        self.listed = done if isinstance(done, (set, frozenset)) else parse_done(done, len(self.faults))
        self.done = set()
        self.fired = set()
        self._clock = clock
        self._t0 = clock()
        self._rng = {}
        self._next = {}
        for f in self.faults:
            if f.random and self._applies(f):
                g = Rng.derive(f.seed, (f.index << 32) | rank, launch | (epoch << 32))
                self._rng[f.index] = g
                self._next[f.index] = g.exponential(f.mtbf_s)

    def _applies(self, f):
        return f.rank == self.rank or (f.random and f.rank == -1)

    def elapsed(self):
        return self._clock() - self._t0

    def due(self, step, elapsed_s=None):
        """The faults that fire at `step` on this rank, not done, each fixed one once."""
        now = self.elapsed() if elapsed_s is None else elapsed_s
        out = []
        for f in self.faults:
            if f.index in self.listed or f.index in self.done or not self._applies(f):
                continue
            if not f.random:
                if f.step == step and f.index not in self.fired:
                    self.fired.add(f.index)
                    out.append(f)
            elif self._next[f.index] <= now:
                self._next[f.index] += self._rng[f.index].exponential(f.mtbf_s)
                out.append(f)
        return out

    def mark_done(self, index):
        """Never fire fault `index` again in this process."""
        self.done.add(index)

    def next_arrival(self, index):
        """Seconds since arm of random fault `index`'s next arrival; inf when it will not fire."""
        if index in self.listed or index in self.done or index not in self._next:
            return math.inf
        return self._next[index]

    def __bool__(self):
        return bool(self.faults)


def privileged():
    """Whether this process runs with raised privileges (set-user-ID, set-group-ID or file
    capabilities: the kernel's AT_SECURE, as the C runtime's src/base/env.h checks)."""
    try:
        with open("/proc/self/auxv", "rb") as f:
            data = f.read()
        size = struct.calcsize("LL")
        for off in range(0, len(data) - size + 1, size):
            key, val = struct.unpack_from("LL", data, off)
            if key == 23:  # AT_SECURE
                return val != 0
            if key == 0:
                break
    except OSError:
        pass
    return os.getuid() != os.geteuid() or os.getgid() != os.getegid()


def from_env(rank, launch=None, env=None):
    """The Injector of RK_INJECT armed for `rank` with RK_INJECT_DONE and RK_LAUNCH, or None
    without RK_INJECT. Ignored (None) in a set-user-ID or set-group-ID process, as the C
    runtime does. ValueError starting with the variable's name for a bad value."""
    env = os.environ if env is None else env
    spec = env.get("RK_INJECT")
    if spec is None:
        return None
    if privileged():
        return None
    if launch is None:
        lt = env.get("RK_LAUNCH")
        if lt is None:
            launch = 0
        else:
            r, launch = _digits(lt.encode("utf-8", "surrogateescape"))
            if r != 1:
                raise ValueError(f"RK_LAUNCH: '{quote(lt.encode('utf-8', 'surrogateescape'))}' "
                                 "is not a decimal launch number")
    if not 0 <= rank <= MAX_RANK:
        raise ValueError(f"fault injection: rank {rank} is outside 0..{MAX_RANK}")
    epoch = 0
    et = env.get("RK_REJOIN_EPOCH")
    if et is not None:
        r, epoch = _digits(et.encode("utf-8", "surrogateescape"))
        if r != 1 or epoch >= 1 << 31:
            raise ValueError(f"RK_REJOIN_EPOCH: '{quote(et.encode('utf-8', 'surrogateescape'))}' "
                             "is not a decimal epoch")
    try:
        faults = parse(spec)
    except ValueError as e:
        raise ValueError(f"RK_INJECT: {e}") from None
    try:
        done = parse_done(env.get("RK_INJECT_DONE"), len(faults))
    except ValueError as e:
        raise ValueError(f"RK_INJECT_DONE: {e}") from None
    return Injector(faults, rank, launch, done, epoch=epoch)
