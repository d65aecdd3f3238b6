"""The step guards' arithmetic in its two languages, decision for decision: the same generated
numbers go to src/runtime/guard.c (librekindle.so, through ctypes, as test_worker checks the
heartbeat parser) and to python/rekindle/torch/guards.py, and every decision must be the same:
the loss spike (yes/no, and the z-score bit for bit), the gradient-norm outliers (the flagged
ranks) and the replica vote (root, flagged ranks, strict majority). Seeded (RK_FUZZ_SEED,
default 32); RK_GUARD_N cases per function (default 10000)."""

import ctypes
import importlib.util
import math
import os
import random
import struct
import sys
import unittest

import rktest

# guards.py by its path: `import rekindle.torch.guards` would import torch (the package's
# __init__), which this test does not need.
_spec = importlib.util.spec_from_file_location(
    "rk_guards_under_test", os.path.join(rktest.PYDIR, "rekindle", "torch", "guards.py"))
guards = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(guards)

SEED = int(os.environ.get("RK_FUZZ_SEED", "32"))
N = int(os.environ.get("RK_GUARD_N", "10000"))
SPIKE_WINDOW = 32  # rekindle.torch's (_SPIKE_WINDOW) and rk train's (RK_SPIKE_WINDOW_DEFAULT)
DENORM = 5e-324
BIG = sys.float_info.max


class RkSpike(ctypes.Structure):
    """rk_spike of rekindle/guard.h."""

    _fields_ = [("v", ctypes.POINTER(ctypes.c_double)), ("tmp", ctypes.POINTER(ctypes.c_double)),
                ("window", ctypes.c_int), ("n", ctypes.c_int), ("next", ctypes.c_int),
                ("z", ctypes.c_double)]


def bits(x):
    return struct.pack("<d", x)


def same_z(a, b):
    """Bit for bit, any NaN equal to any NaN."""
    return (math.isnan(a) and math.isnan(b)) or bits(a) == bits(b)


def lib():
    so = rktest.librekindle()
    if so is None:
        raise unittest.SkipTest("librekindle.so not built")
    c = ctypes.CDLL(so)
    c.rk_spike_init.argtypes = [ctypes.POINTER(RkSpike), ctypes.c_int, ctypes.c_double, ctypes.c_void_p]
    c.rk_spike_free.argtypes = [ctypes.POINTER(RkSpike)]
    c.rk_spike_test.argtypes = [ctypes.POINTER(RkSpike), ctypes.c_double, ctypes.POINTER(ctypes.c_double)]
    c.rk_spike_push.argtypes = [ctypes.POINTER(RkSpike), ctypes.c_double]
    c.rk_spike_reset.argtypes = [ctypes.POINTER(RkSpike)]
    c.rk_guard_outliers.argtypes = [ctypes.POINTER(ctypes.c_double), ctypes.c_int, ctypes.c_double,
                                    ctypes.POINTER(ctypes.c_ubyte)]
    c.rk_guard_vote.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                ctypes.POINTER(ctypes.c_ubyte), ctypes.POINTER(ctypes.c_int)]
    return c


# ---- generators: one seeded stream per function ---------------------------------------------

def a_scale(r):
    """The size of a run's losses or norms: ordinary, tiny, subnormal, huge, zero, negative."""
    return r.choice([1.0, 1.0, 2.5, 0.03, 1e-300, 1e-310, 1e-320, 100 * DENORM, DENORM, 1e300, 1e307,
                     BIG / 2, 0.0, -1.0, -1e-5, -1e300])


def a_loss_run(r, k):
    """k losses of one run: noise around a level, ties, all equal, a majority equal (MAD 0), a
    few values only, subnormals, huge ones whose sums overflow, NaN and infinities mixed in."""
    level, kind = a_scale(r), r.randrange(7)
    rel = r.choice([0.0, 1e-12, 1e-3, 0.05, 0.5, 3.0])
    if kind == 0:  # noise
        v = [level + abs(level or 1.0) * rel * r.gauss(0, 1) for _ in range(k)]
    elif kind == 1:  # all equal
        v = [level] * k
    elif kind == 2:  # more than half equal: MAD 0, the floor decides
        v = [level if r.random() < 0.7 else level * (1 + r.choice([-1, 1]) * r.random()) for _ in range(k)]
    elif kind == 3:  # a few values, many ties
        few = [level * r.choice([0.5, 1.0, 1.5, 2.0, -1.0]) for _ in range(r.randrange(1, 4))]
        v = [r.choice(few) for _ in range(k)]
    elif kind == 4:  # subnormal steps
        v = [DENORM * r.randrange(0, 300) * r.choice([1, 1, -1]) for _ in range(k)]
    elif kind == 5:  # huge: the median's and the deviations' sums overflow
        v = [r.choice([1, -1, 1]) * BIG * r.uniform(0.3, 1.0) for _ in range(k)]
    else:  # zeros of both signs
        v = [r.choice([0.0, -0.0, 0.0, DENORM]) for _ in range(k)]
    # non-finite losses: neither side keeps them (rk_spike_push ignores them; rekindle.torch
    # appends only finite losses)
    return [r.choice([math.nan, math.inf, -math.inf]) if r.random() < 0.05 else x for x in v]


def median(v):
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def a_new_loss(r, window, limit):
    """A loss to test: from the window, at the edges of the spike threshold and of
    spike_zscore_over's shortcut (one ulp either side), far off, non-finite."""
    k = r.randrange(9)
    if not window or k == 0:
        return r.choice([0.0, -0.0, 1.0, DENORM, BIG, -BIG, 1e-300])
    med = median(window)
    mad = max(median([abs(x - med) for x in window]), 1e-2 * abs(med))
    if k == 1:  # a loss of the window, or an ulp or two above it
        x = r.choice(window)
        for _ in range(r.choice([0, 1, 1, 2])):
            x = math.nextafter(x, math.inf)
        return x
    if k == 2:  # z = limit exactly, or an ulp off
        x = med + limit * 1.4826 * mad
    elif k == 3:  # spike_zscore_over's shortcut edge
        x = med + 0.5 * limit * 1.4826e-2 * abs(med)
    elif k == 4:
        x = med + r.uniform(0, 3) * limit * 1.4826 * mad
    elif k == 5:
        x = med - r.uniform(0, 3) * limit * 1.4826 * mad
    elif k == 6:
        x = med * r.choice([2.0, 10.0, 1e6, -1.0, 0.5])
    elif k == 7:
        return r.choice([math.nan, math.inf, -math.inf])
    else:  # the largest: loss - median overflows where the median is negative
        x = r.choice([BIG, BIG, -BIG, DENORM, -DENORM, 0.0, -0.0])
    for _ in range(r.choice([0, 0, 1, 2])):
        x = math.nextafter(x, r.choice([math.inf, -math.inf]))
    return x


def a_norm_vector(r, n, ratio):
    """n ranks' gradient norms: ordinary, ties, zeros of both signs, an outlier at ratio x the
    median (an ulp either side), ranks without samples (negative), NaN, infinities, subnormal
    and huge ones."""
    level = abs(a_scale(r)) or 1.0
    spread = r.choice([0.0, 0.01, 0.3, 2.0])
    v = [level * math.exp(spread * r.gauss(0, 1)) for _ in range(n)]
    for i in range(n):
        k = r.random()
        if k < 0.05:
            v[i] = r.choice([math.nan, math.inf, -math.inf])
        elif k < 0.10:
            v[i] = r.choice([-1.0, -1e-300, -0.5])  # a rank without samples
        elif k < 0.18:
            v[i] = r.choice([0.0, -0.0])
        elif k < 0.26:
            v[i] = v[r.randrange(n)]  # a tie
        elif k < 0.30:
            v[i] = r.choice([DENORM, 7 * DENORM, BIG, 1e300])
    if r.random() < 0.5:  # an outlier at the edge: ratio x the usable median, or an ulp off
        ok = [x for x in v if math.isfinite(x) and x >= 0]
        if len(ok) >= 2:
            base = median(ok) if len(ok) >= 3 else min(ok)
            x = ratio * base
            for _ in range(r.choice([0, 1, 1, 2])):
                x = math.nextafter(x, r.choice([math.inf, -math.inf]))
            v[r.randrange(n)] = x
    return v


def a_hash_vector(r, n):
    """n replica hashes: all equal, one off, a majority, a two-way split, all different, a
    few values, extremes of the 64 bits."""
    k = r.randrange(6)
    pool = [r.getrandbits(64) for _ in range(4)] + [0, (1 << 64) - 1, 1 << 63]
    if k == 0:
        return [pool[0]] * n
    if k == 1:
        v = [pool[0]] * n
        v[r.randrange(n)] = pool[1]
        return v
    if k == 2:  # two-way split, halves interleaved or not
        v = [pool[0]] * (n // 2) + [pool[1]] * (n - n // 2)
        if r.random() < 0.5:
            r.shuffle(v)
        return v
    if k == 3:
        return [r.getrandbits(64) for _ in range(n)]
    if k == 4:
        few = pool[:r.randrange(1, 5)]
        return [r.choice(few) for _ in range(n)]
    m = pool[r.randrange(len(pool))]  # a majority with noise
    return [m if r.random() < 0.6 else r.choice(pool) for _ in range(n)]


def a_world(r):
    return r.choice([1, 2, 2, 3, 3, 4, 4, 5, 6, 7, 8, r.randrange(1, 17), r.randrange(1, 65)])


# ---- the tests ---------------------------------------------------------------------------------

class TestGuardsAgainstC(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = lib()

    def test_loss_spike(self):
        """rk_spike (window W, threshold Z, the losses pushed one by one, resets) against
        rekindle.torch's rule: the last W finite losses, a spike when the window is full and
        spike_zscore_over(...) > Z; the z-score of a full window is spike_zscore's, bit for
        bit. A non-finite loss is a spike in C and a `nan` trip in rekindle.torch (its own
        check, before the spike test)."""
        c, r = self.c, random.Random(SEED)
        sp = RkSpike()
        z = ctypes.c_double()
        full = spikes = 0
        for case in range(N):
            w = r.choice([SPIKE_WINDOW, SPIKE_WINDOW, 3, 4, 5, 6, 7, 8, 16, 31, 33, 64, r.randrange(3, 65)])
            limit = r.choice([10.0, 10.0, 6.0, 1.0, 0.01, 3.5, 1e6, 1e300, r.uniform(0.5, 1), r.uniform(0.1, 50)])
            self.assertEqual(c.rk_spike_init(ctypes.byref(sp), w, limit, None), 0)
            try:
                window = []
                pushes = r.choice([0, 1, 2, w - 1, w, w, w + 1, 2 * w, r.randrange(0, 3 * w)])
                hist = a_loss_run(r, pushes)
                if r.random() < 0.1:  # a reset (a rollback) somewhere in the history
                    hist.insert(r.randrange(len(hist) + 1), None)
                for x in hist:
                    if x is None:
                        c.rk_spike_reset(ctypes.byref(sp))
                        window = []
                        continue
                    c.rk_spike_push(ctypes.byref(sp), x)
                    if math.isfinite(x):  # rekindle.torch: append, keep the last W
                        window = (window + [x])[-w:]
                for _ in range(3):  # three losses tested against the same window
                    loss = a_new_loss(r, window, limit)
                    got = c.rk_spike_test(ctypes.byref(sp), loss, ctypes.byref(z))
                    what = f"case {case}: W {w} Z {limit!r} window {window!r} loss {loss!r}"
                    if not math.isfinite(loss):
                        self.assertEqual((got, z.value), (1, 0.0), what)
                        continue
                    if len(window) < w:
                        self.assertEqual((got, bits(z.value)), (0, bits(0.0)), what)
                        continue
                    full += 1
                    zp = guards.spike_zscore(window, loss)
                    over = guards.spike_zscore_over(window, loss, limit)
                    self.assertTrue(same_z(z.value, zp), f"{what}: z C {z.value!r} Python {zp!r}")
                    self.assertEqual(bool(got), over > limit, f"{what}: C {got} z {z.value!r} over {over!r}")
                    self.assertTrue(bits(over) == bits(0.0) or same_z(over, zp), f"{what}: over {over!r}")
                    spikes += bool(got)
            finally:
                c.rk_spike_free(ctypes.byref(sp))
        # the generator reaches both answers often
        self.assertGreater(full, N // 3)
        self.assertGreater(spikes, N // 20)
        self.assertLess(spikes, full - N // 20)

    def test_grad_outliers(self):
        """rk_guard_outliers against grad_outliers: the same flagged ranks."""
        c, r = self.c, random.Random(SEED + 1)
        flagged = 0
        for case in range(N):
            n = a_world(r)
            ratio = r.choice([1000.0, 1000.0, 50.0, 2.0, 1e30, 1.0, 0.5, r.uniform(2, 5000)])
            v = a_norm_vector(r, n, ratio)
            flags = (ctypes.c_ubyte * n)()
            cnt = c.rk_guard_outliers((ctypes.c_double * n)(*v), n, ratio, flags)
            want = [i for i in range(n) if flags[i]]
            self.assertEqual(cnt, len(want))
            got = guards.grad_outliers(v, ratio)
            self.assertEqual(got, want, f"case {case}: ratio {ratio!r} norms {v!r}")
            flagged += bool(want)
        self.assertGreater(flagged, N // 10)
        self.assertLess(flagged, N - N // 10)

    def test_replica_vote(self):
        """rk_guard_vote against replica_vote: the same root, flagged ranks and strictness."""
        c, r = self.c, random.Random(SEED + 2)
        for case in range(N):
            n = a_world(r)
            h = a_hash_vector(r, n)
            flags = (ctypes.c_ubyte * n)()
            root, strict = ctypes.c_int(-1), ctypes.c_int(-1)
            cnt = c.rk_guard_vote((ctypes.c_uint64 * n)(*h), n, ctypes.byref(root), flags, ctypes.byref(strict))
            want = [i for i in range(n) if flags[i]]
            self.assertEqual(cnt, len(want))
            got = guards.replica_vote(h)
            self.assertEqual(got, (root.value, want, bool(strict.value)), f"case {case}: hashes {h!r}")


if __name__ == "__main__":
    unittest.main()
