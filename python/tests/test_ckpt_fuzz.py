"""A fuzz run of rekindle.ckpt's reader: valid checkpoints mutated (bit flips, cut and spliced
bytes, a rewritten length, JSON tokens dropped into the header) are refused with CheckpointError
and never with another exception, each within a bounded time; and the C reader
(rk_ckpt_parse in librekindle.so, through ctypes) gives the same verdict on every one, and the
same message where neither is about JSON syntax (the two parsers word those differently).
RK_FUZZ_N sets the count, RK_FUZZ_SEED the seed."""

import ctypes
import json
import os
import random
import struct
import time
import unittest

import rktest
from rekindle import _ckptfile, ckpt
from rekindle.ckpt import CheckpointError, Item

TOKENS = [b"[", b"]", b"{", b"}", b'"', b",", b":", b"\\u0000", b"\\ud800", b"1e999", b"NaN",
          b"-1", b"18446744073709551616", b"0.5", b"null", b"true", b"[[[[[[[[", b'"dtype"',
          b'"shape":[]', b'"data_offsets":[0,0]', b'"__metadata__"', b"\xff", b"\xc3", b" " * 9]


def samples():
    out = []
    its = [Item("model.w", "F32", (3, 2), struct.pack("<6f", *range(6))),
           Item("optim.v", "F64", (2,), struct.pack("<2d", 0.5, -1)),
           Item("rng.s", "U8", (5,), b"abcde"), Item("data.pos", "I64", (), struct.pack("<q", 7)),
           Item("e", "BF16", (0,), b""), Item("h", "F16", (1,), b"\0\x3c")]
    for k in range(1, len(its) + 1):
        hdr, datas = ckpt.encode(k * 10, its[:k], epoch=k, cursor=k * 3, world_size=k,
                                 config='{"model":"m%d","x":[1,2,{"y":null}]}' % k)
        out.append((k * 10, hdr + b"".join(bytes(d) for d in datas)))
    return out


def mutate_json(r, buf):
    """A header that is still JSON but says something else (a value, a key, an offset, a dtype
    changed, a key removed), the manifest checksum recomputed half of the time so the checks
    behind it are reached."""
    n = int.from_bytes(buf[:8], "little")
    h = json.loads(buf[8 : 8 + n])
    data = buf[8 + n :]
    meta = h["__metadata__"]
    for _ in range(r.randint(1, 2)):
        names = [k for k in h if k != "__metadata__"]
        try:
            _mutate_header(r, h, meta, names)
        except (KeyError, TypeError, ValueError, AttributeError):
            pass  # a mutation of a mutation that no longer applies
        if r.random() < 0.2:
            data = data + bytes(r.randrange(256) for _ in range(r.randint(0, 8)))
            data = data[: max(0, len(data) - r.randint(0, 8))]
    if r.random() < 0.5 and isinstance(meta, dict):
        try:
            tensors = sorted(((k, v["dtype"], v["shape"], *v["data_offsets"]) for k, v in h.items()
                              if k != "__metadata__"), key=lambda t: t[3])
            meta["xxh64.__manifest__"] = _ckptfile._manifest_hash(meta, tensors)
        except Exception:
            pass
    js = json.dumps(h, separators=(",", ":"), ensure_ascii=False).encode()
    js += b" " * (-len(js) % 8)
    return len(js).to_bytes(8, "little") + js + data


def _mutate_header(r, h, meta, names):
    op = r.randrange(7)
    if op == 0:
        k = r.choice(sorted(meta))
        meta[k] = r.choice(["", "0", "01", "-1", "7", "9223372036854775808", "{", "[]", "NaN",
                            "0" * 16, "ffffffffffffffff", meta[k] + "x", "rekindle-ckpt-1"])
    elif op == 1:
        meta.pop(r.choice(sorted(meta)))
    elif op == 2 and names:
        t = h[r.choice(names)]
        t["dtype"] = r.choice(list(ckpt.DTYPE_SIZE) + ["F128", "", 4])
    elif op == 3 and names:
        t = h[r.choice(names)]
        t["shape"] = r.choice([[], [0], [1], [2, 3], [3, 2], [-1], [1.5], [2**62, 4], [1] * 9, "x"])
    elif op == 4 and names:
        t = h[r.choice(names)]
        a, e = t["data_offsets"]
        t["data_offsets"] = r.choice([[a, e + 1], [a + 1, e], [e, a], [0, e - a], [a], [a, e, 0],
                                      [a, 10**20], [True, e]])
    elif op == 5 and names:
        h[r.choice(names) + r.choice(["", "x", "\u00e9"])] = h.pop(r.choice(names))
    elif op == 6 and names:
        h[r.choice(names)][r.choice(["extra", "dtype", "shape"])] = None


def mutate(r, buf):
    if r.random() < 0.3:
        return mutate_json(r, buf)
    b = bytearray(buf)
    for _ in range(r.randint(1, 4)):
        op = r.randrange(9)
        n = len(b)
        if op == 0 and n:
            i = r.randrange(n)
            b[i] ^= 1 << r.randrange(8)
        elif op == 1 and n:
            b[r.randrange(n)] = r.randrange(256)
        elif op == 2:
            del b[r.randint(0, n):]
        elif op == 3:
            b += bytes(r.randrange(256) for _ in range(r.randint(1, 16)))
        elif op == 4 and n > 8:
            i = r.randrange(8, n)
            del b[i : i + r.randint(1, 20)]
        elif op == 5:
            v = r.choice([0, 1, 7, n - 8, n, 10**8, 10**8 + 1, 2**63, 2**64 - 1, r.randrange(2**64)])
            b[0:8] = (v % 2**64).to_bytes(8, "little")
        elif op == 6 and n > 8:
            i = r.randrange(8, n)
            b[i:i] = r.choice(TOKENS)
        elif op == 7 and n > 16:
            i, j = sorted(r.sample(range(8, n), 2))
            b[i:i] = b[i:j]
        elif op == 8 and n > 8:
            i = r.randrange(8, n)
            digits = [k for k in range(8, n) if 0x30 <= b[k] <= 0x39]
            if digits:
                b[r.choice(digits)] = r.choice(b"0123456789")
    return bytes(b)


class TestReaderFuzz(unittest.TestCase):
    def test_mutated_checkpoints(self):
        r = random.Random(int(os.environ.get("RK_FUZZ_SEED", "1")))
        n = int(os.environ.get("RK_FUZZ_N", "3000"))
        base = samples()
        for step, buf in base:
            ckpt.parse(buf, ckpt.file_name(step))
        d = rktest.tmpdir(self)
        refused = accepted = 0
        worst = 0.0
        t_all = time.monotonic()
        for i in range(n):
            step, buf = r.choice(base)
            m = mutate(r, buf)
            name = ckpt.file_name(step)
            t = time.monotonic()
            try:
                if i % 10 == 0:  # through the file reader too
                    p = os.path.join(d, name)
                    with open(p, "wb") as f:
                        f.write(m)
                    c = ckpt.load(p)
                else:
                    c = ckpt.parse(m, name)
                accepted += 1
                self.assertEqual(c.step, step)
            except CheckpointError as e:
                refused += 1
                self.assertNotIn("\n", str(e))
                self.assertIn(name, str(e))
            worst = max(worst, time.monotonic() - t)
        self.assertLess(worst, 2.0)
        self.assertLess(time.monotonic() - t_all, 120)
        self.assertGreater(refused, n * 8 // 10)
        print(f"\nckpt reader fuzz: {n} mutated files, {refused} refused, {accepted} accepted "
              f"(mutations that leave a valid checkpoint), slowest {worst * 1000:.1f} ms",
              end=" ")


class CReader:
    class Err(ctypes.Structure):
        _fields_ = [("code", ctypes.c_int), ("msg", ctypes.c_char * 512)]

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.rk_ckpt_parse.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                                           ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(self.Err)]
        self.lib.rk_ckpt_free.argtypes = [ctypes.c_void_p]

    def parse(self, buf, name):
        """None when the C reader accepts `buf`, else its message."""
        h, e = ctypes.c_void_p(), self.Err()
        if self.lib.rk_ckpt_parse(buf, len(buf), name.encode(), ctypes.byref(h), ctypes.byref(e)):
            return e.msg.decode("utf-8", "replace")
        self.lib.rk_ckpt_free(h)
        return None


@unittest.skipIf(rktest.librekindle() is None, "librekindle.so not built")
class TestAgainstC(unittest.TestCase):
    def test_same_verdicts(self):
        c = CReader(rktest.librekindle())
        r = random.Random(int(os.environ.get("RK_FUZZ_SEED", "1")) + 100)
        n = int(os.environ.get("RK_FUZZ_N", "3000"))
        base = samples()
        same = compared = 0
        for _ in range(n):
            step, buf = r.choice(base)
            m = mutate(r, buf)
            name = ckpt.file_name(step)
            cm = c.parse(m, name)
            try:
                ckpt.parse(m, name)
                pm = None
            except CheckpointError as e:
                pm = str(e)
            self.assertEqual(cm is None, pm is None, f"C: {cm}\nPython: {pm}\n{m[:200]!r}")
            if cm is not None and "JSON" not in cm + pm and "duplicate key" not in cm + pm:
                compared += 1
                same += cm == pm
                if cm != pm and "tensor" in cm and "tensor" in pm:
                    continue  # C checks entry by entry, Python the whole header first
                self.assertEqual(pm, cm)
        print(f"\nC and Python readers: {n} mutated files, same verdict on all; "
              f"{same} of {compared} messages compared identical", end=" ")


if __name__ == "__main__":
    unittest.main()
