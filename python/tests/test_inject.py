"""rekindle.inject: docs/inject.md's examples and errors, a differential test against the C parser
(rk_inject_parse in librekindle.so, through ctypes; skipped without a build) over thousands of
random and mutated specs, the Injector's runtime rules, from_env, and a fuzz run."""

import ctypes
import math
import random
import time
import unittest

import rktest
from rekindle import inject
from rekindle.inject import Fault

DOC_SPEC = ("crash@step=120:rank=2,hang@step=300:rank=1,nan@step=200,bitflip@step=400:rank=3,"
            "slow@step=50:rank=0:ms=200:for=20,commfail@step=500:rank=1,gradflip@step=250:rank=0,"
            "crash@mtbf=120s:seed=7")

SEEDS = [DOC_SPEC.encode(), b"crash@mtbf=1.5h", b"slow@for=3:ms=100:step=009",
         b"crash@mtbf=250ms:rank=3:seed=18446744073709551615", b"nan@step=4611686018427387904",
         b"hang@mtbf=0.5m, nan@step=1,  slow@step=2", b"gradflip@step=0:rank=65535"]
ALPHA = b"@,:=. 0123456789smhabcdefghijklnoprtuwxyz\xff\x01-+_"
PIECES = [b",", b", ", b"step=", b"mtbf=", b".5", b"ms", b"crash@", b"slow@", b":seed=1",
          b":rank=65536", b":for=", b":ms=600001", b"0" * 30]


def mutate(r):
    s = bytearray(r.choice(SEEDS))
    for _ in range(r.randint(0, 5)):
        op, pos = r.randint(0, 3), r.randint(0, len(s))
        if op == 0 and s:
            del s[min(pos, len(s) - 1)]
        elif op == 1:
            s.insert(pos, r.choice(ALPHA))
        elif op == 2 and s:
            s[min(pos, len(s) - 1)] = r.choice(ALPHA)
        else:
            s[pos:pos] = r.choice(PIECES + [b"9" * r.randint(1, 25)])
    if r.random() < 0.02:
        s = s + b"," + (bytes(s) + b",") * r.randint(20, 300)
        s = s[:-1]
    if r.random() < 0.05:
        s = bytes(r.choice(ALPHA) for _ in range(r.randint(0, 30)))
    return bytes(s)


class CParser:
    """rk_inject_parse of librekindle.so."""

    class Err(ctypes.Structure):
        _fields_ = [("code", ctypes.c_int), ("msg", ctypes.c_char * 512)]

    class F(ctypes.Structure):
        _fields_ = [("kind", ctypes.c_int), ("step", ctypes.c_int64), ("rank", ctypes.c_int),
                    ("mtbf_s", ctypes.c_double), ("seed", ctypes.c_uint64), ("ms", ctypes.c_int),
                    ("steps", ctypes.c_int64)]

    def __init__(self, path):
        lib = ctypes.CDLL(path)
        lib.rk_inject_parse.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p),
                                        ctypes.POINTER(self.Err)]
        lib.rk_inject_get.restype = ctypes.POINTER(self.F)
        lib.rk_inject_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.rk_inject_count.restype = ctypes.c_size_t
        lib.rk_inject_count.argtypes = [ctypes.c_void_p]
        lib.rk_inject_free.argtypes = [ctypes.c_void_p]
        lib.rk_inject_arm.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64,
                                      ctypes.c_char_p, ctypes.POINTER(self.Err)]
        lib.rk_inject_next_arrival.restype = ctypes.c_double
        lib.rk_inject_next_arrival.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.rk_inject_due.restype = ctypes.c_size_t
        lib.rk_inject_due.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_double,
                                      ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t]
        self.lib = lib

    def arrivals(self, spec, rank, launch, until, step_s):
        """(first arrivals, [(elapsed, [indices])]) of the C runtime for `spec` on `rank`."""
        h, e = ctypes.c_void_p(), self.Err()
        assert self.lib.rk_inject_parse(spec.encode(), ctypes.byref(h), ctypes.byref(e)) == 0
        assert self.lib.rk_inject_arm(h, rank, launch, None, ctypes.byref(e)) == 0, e.msg
        n = self.lib.rk_inject_count(h)
        first = [self.lib.rk_inject_next_arrival(h, i) for i in range(n)]
        idx = (ctypes.c_size_t * 256)()
        fired = []
        t = 0.0
        while t < until:
            k = self.lib.rk_inject_due(h, 0, t, idx, 256)
            if k:
                fired.append((t, [idx[j] for j in range(k)]))
            t += step_s
        self.lib.rk_inject_free(h)
        return first, fired

    def parse(self, b):
        h, e = ctypes.c_void_p(), self.Err()
        if self.lib.rk_inject_parse(b, ctypes.byref(h), ctypes.byref(e)):
            return ("error", e.msg.decode("utf-8", "replace"))
        out = []
        for i in range(self.lib.rk_inject_count(h)):
            f = self.lib.rk_inject_get(h, i).contents
            out.append((inject.KINDS[f.kind], i, f.step, f.mtbf_s, f.rank, f.seed, f.ms, f.steps))
        self.lib.rk_inject_free(h)
        return ("ok", out)


def py_parse(b):
    try:
        return ("ok", [f._t() for f in inject.parse(b)])
    except ValueError as e:
        return ("error", str(e))


class TestGrammar(unittest.TestCase):
    def test_doc_spec(self):
        f = inject.parse(DOC_SPEC)
        self.assertEqual(len(f), 8)
        self.assertEqual(f[0], Fault("crash", 0, 120, 0.0, 2, 0, 0, 0))
        self.assertEqual(f[2], Fault("nan", 2, 200, 0.0, 0, 0, 0, 0))  # no rank=: rank 0
        self.assertEqual(f[4], Fault("slow", 4, 50, 0.0, 0, 0, 200, 20))
        self.assertEqual(f[7], Fault("crash", 7, -1, 120.0, -1, 7, 0, 0))  # mtbf: every rank
        self.assertEqual(inject.parse("slow@step=1")[0].ms, 100)
        self.assertEqual(inject.parse("crash@mtbf=1.5h")[0].mtbf_s, 5400.0)
        self.assertEqual(inject.parse("crash@mtbf=250ms")[0].mtbf_s, 0.25)
        self.assertEqual(inject.parse("crash@mtbf=2m")[0].seed, 1)
        self.assertEqual(inject.parse("nan@step=009")[0].step, 9)
        self.assertEqual(inject.parse(""), [])
        self.assertEqual(inject.parse(None), [])
        self.assertEqual(len(inject.parse("nan@step=1,  hang@step=2")), 2)

    def test_doc_errors(self):
        table = {
            "crsh@step=1": "fault spec: position 1: unknown fault kind 'crsh' (expected crash, hang, "
                           "nan, bitflip, gradflip, slow, commfail)",
            "crash@step=1:rnk=2": "fault spec: position 14: unknown key 'rnk' (expected step, rank, "
                                  "mtbf, seed, ms, for)",
            "nan@step=5,crash@step=12x": "fault spec: position 23: bad value '12x' for step "
                                         "(expected a decimal integer 0..4611686018427387904)",
            "slow@step=1:ms=600001": "fault spec: position 16: ms=600001 is out of range (1..600000)",
            "hang@step=3:seed=2": "fault spec: position 13: seed= is only allowed with mtbf= (a "
                                  "step= fault is not random)",
            "nan@step=1,": "fault spec: position 12: missing fault kind (expected crash, hang, nan, "
                           "bitflip, gradflip, slow, commfail)",
        }
        for spec, msg in table.items():
            with self.assertRaises(ValueError) as cm:
                inject.parse(spec)
            self.assertEqual(str(cm.exception), msg)

    def test_more_errors(self):
        for spec, at in (("nan@step=1, nan@step=1:step=2", 24), ("nan@step=1:mtbf=1", 12),
                         ("nan@step=1:ms=3", 12), ("nan@", 5), ("nan", 4), ("nan@step", 9),
                         ("nan@step=", 10), (" nan@step=1", 1), ("nan@step=1 ", 10),
                         ("nan@mtbf=.5", 10), ("nan@mtbf=5.", 10), ("nan@mtbf=0", 10),
                         ("nan@mtbf=1e3", 10), ("nan@rank=1", 1), ("nan@step=-1", 10),
                         ("nan@step=\u00e9", 10), ("x" * 4097, 4097)):
            with self.assertRaisesRegex(ValueError, rf"^fault spec: position {at}: ", msg=spec):
                inject.parse(spec)
        with self.assertRaisesRegex(ValueError, "more than 256 faults"):
            inject.parse(",".join(["nan@step=1"] * 257))
        self.assertEqual(len(inject.parse(",".join(["nan@step=1"] * 256))), 256)
        with self.assertRaises(ValueError) as cm:
            inject.parse(b"nan@step=1:\x01'\\" + b"z" * 50 + b"=1")
        self.assertIn("unknown key '\\x01\\'\\\\zzz", str(cm.exception))
        self.assertIn("...' (expected", str(cm.exception))

    def test_fuzz_only_value_errors(self):
        r = random.Random(3)
        t0 = time.monotonic()
        for _ in range(3000):
            b = bytes(r.randrange(256) for _ in range(r.randint(0, 60))) if r.random() < 0.3 \
                else mutate(r)
            try:
                inject.parse(b)
            except ValueError as e:
                self.assertTrue(str(e).startswith("fault spec: position "), str(e))
                self.assertNotIn("\n", str(e))
        self.assertLess(time.monotonic() - t0, 30)


@unittest.skipIf(rktest.librekindle() is None, "librekindle.so not built")
class TestAgainstC(unittest.TestCase):
    def test_same_verdicts_and_messages(self):
        c = CParser(rktest.librekindle())
        r = random.Random(11)
        n = accepted = 0
        for _ in range(6000):
            b = mutate(r).replace(b"\0", b"")
            got_c, got_py = c.parse(b), py_parse(b)
            self.assertEqual(got_py, got_c, b[:200])
            n += 1
            accepted += got_c[0] == "ok"
        # both outcomes are well represented
        self.assertGreater(accepted, n // 10)
        self.assertLess(accepted, n - n // 10)


    def test_same_random_arrivals(self):
        c = CParser(rktest.librekindle())
        for spec, rank, launch in (("crash@mtbf=10s", 0, 0), ("crash@mtbf=10s", 3, 0),
                                   ("crash@mtbf=10s", 3, 7), ("hang@mtbf=1.5m:seed=0,nan@step=4,"
                                                             "slow@mtbf=250ms:rank=2:seed=99", 2, 1),
                                   ("crash@mtbf=3s:seed=18446744073709551615", 65535, 2**63)):
            first, fired = c.arrivals(spec, rank, launch, 600.0, 0.25)
            now = [0.0]
            inj = inject.Injector(spec, rank, launch, clock=lambda: now[0])
            self.assertEqual([inj.next_arrival(i) for i in range(len(first))], first, spec)
            got = []
            t = 0.0
            while t < 600.0:
                now[0] = t
                fs = [f.index for f in inj.due(0) if f.random]
                if fs:
                    got.append((t, fs))
                t += 0.25
            self.assertEqual(got, fired, spec)
            self.assertGreater(len(got), 0)


class TestInjector(unittest.TestCase):
    def test_step_faults_fire_once_on_their_rank(self):
        inj = inject.Injector("crash@step=3:rank=1,nan@step=3,slow@step=3:rank=1:for=2", rank=1)
        self.assertEqual(inj.due(2), [])
        self.assertEqual([f.index for f in inj.due(3)], [0, 2])
        self.assertEqual(inj.due(3), [])  # once
        r0 = inject.Injector("crash@step=3:rank=1,nan@step=3", rank=0)
        self.assertEqual([f.kind for f in r0.due(3)], ["nan"])

    def test_done_list(self):
        inj = inject.Injector("crash@step=3,nan@step=4,hang@step=5", 0, done="0, 2")
        self.assertEqual(inj.due(3), [])
        self.assertEqual([f.kind for f in inj.due(4)], ["nan"])
        self.assertEqual(inj.due(5), [])
        inj2 = inject.Injector("crash@step=3,nan@step=4", 0)
        inj2.mark_done(1)
        self.assertEqual(inj2.due(4), [])
        for done, msg in (("0,7", "fault done list '0,7': position 3: bad fault index '7' (expected 0..1)"),
                          ("0,,1", "fault done list '0,,1': position 3: missing fault index '' (expected 0..1)"),
                          ("x", "fault done list 'x': position 1: bad fault index 'x' (expected 0..1)")):
            with self.assertRaises(ValueError) as cm:
                inject.Injector("crash@step=3,nan@step=4", 0, done=done)
            self.assertEqual(str(cm.exception), msg)
        with self.assertRaisesRegex(ValueError, r"\(the spec has no faults\)"):
            inject.parse_done("0", 0)

    def test_mtbf_arrivals(self):
        now = [0.0]
        spec = "crash@mtbf=10s:seed=5,hang@mtbf=1m:rank=2"
        a = inject.Injector(spec, rank=0, launch=0, clock=lambda: now[0])
        b = inject.Injector(spec, rank=0, launch=0, clock=lambda: now[0])
        c = inject.Injector(spec, rank=1, launch=0, clock=lambda: now[0])
        d = inject.Injector(spec, rank=0, launch=1, clock=lambda: now[0])
        self.assertEqual(a.next_arrival(0), b.next_arrival(0))
        self.assertNotEqual(a.next_arrival(0), c.next_arrival(0))
        self.assertNotEqual(a.next_arrival(0), d.next_arrival(0))
        self.assertEqual(a.next_arrival(1), math.inf)  # rank 2's
        fired = 0
        for t in range(0, 100000, 1):
            now[0] = t / 10
            got = a.due(0)
            self.assertLessEqual(len(got), 1)
            fired += len(got)
        self.assertTrue(700 < fired < 1300, fired)  # 10000 s at a mean of 10 s

    def test_from_env(self):
        self.assertIsNone(inject.from_env(0, env={}))
        inj = inject.from_env(1, env={"RK_INJECT": "crash@step=3:rank=1,nan@step=4",
                                      "RK_INJECT_DONE": "1", "RK_LAUNCH": "2"})
        self.assertEqual((inj.rank, inj.launch), (1, 2))
        self.assertEqual([f.index for f in inj.due(3)], [0])
        with self.assertRaisesRegex(ValueError, "^RK_INJECT: fault spec: position 1: "):
            inject.from_env(0, env={"RK_INJECT": "boom"})
        with self.assertRaisesRegex(ValueError, "^RK_INJECT_DONE: fault done list "):
            inject.from_env(0, env={"RK_INJECT": "nan@step=1", "RK_INJECT_DONE": "5"})
        with self.assertRaisesRegex(ValueError, "^RK_LAUNCH: 'x' is not a decimal launch number"):
            inject.from_env(0, env={"RK_INJECT": "nan@step=1", "RK_LAUNCH": "x"})
        self.assertEqual(inject.from_env(0, env={"RK_INJECT": ""}).faults, [])
        self.assertFalse(inject.privileged())

    def test_replacement_draws_its_own_arrivals(self):
        """A rank started again in place (RK_REJOIN_EPOCH) is a new process of the same rank and
        launch: it must not replay its predecessor's random arrivals from its own start."""
        env = {"RK_INJECT": "crash@mtbf=30s:seed=7", "RK_LAUNCH": "3"}
        first = inject.from_env(2, env=env)
        self.assertEqual(first.epoch, 0)
        again = inject.from_env(2, env=dict(env, RK_REJOIN_EPOCH="0"))
        self.assertEqual(first.next_arrival(0), again.next_arrival(0))  # epoch 0: the launch's own
        arrivals = {inject.from_env(2, env=dict(env, RK_REJOIN_EPOCH=str(e))).next_arrival(0) for e in range(1, 6)}
        self.assertEqual(len(arrivals), 5)
        self.assertNotIn(first.next_arrival(0), arrivals)
        for bad in ("x", "-1", "2147483648", ""):
            with self.assertRaisesRegex(ValueError, "^RK_REJOIN_EPOCH: .* is not a decimal epoch"):
                inject.from_env(2, env=dict(env, RK_REJOIN_EPOCH=bad))


if __name__ == "__main__":
    unittest.main()
