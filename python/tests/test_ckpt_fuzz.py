"""A fuzz run of rekindle.ckpt's reader: valid checkpoints mutated (bit flips, cut and spliced
bytes, a rewritten length, JSON tokens dropped into the header) are refused with CheckpointError
and never with another exception, each within a bounded time. RK_FUZZ_N sets the count."""

import os
import random
import struct
import time
import unittest

import rktest
from rekindle import ckpt
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


def mutate(r, buf):
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
        self.assertGreater(refused, n * 9 // 10)
        print(f"\nckpt reader fuzz: {n} mutated files, {refused} refused, {accepted} accepted "
              f"(mutations that leave a valid file, e.g. JSON whitespace), slowest {worst * 1000:.1f} ms",
              end=" ")


if __name__ == "__main__":
    unittest.main()
