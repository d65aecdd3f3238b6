"""rekindle.ckpt with real files: the format, every check of a load, retention, files set aside,
temporary-file cleanup, the finite-values rule, the lock, storage errors, the fallback of
load_latest, and saves killed with SIGKILL at random moments."""

import array
import ctypes
import errno
import itertools
import json
import os
import random
import signal
import stat
import struct
import subprocess
import sys
import time
import unittest
from unittest import mock

import rktest
from rekindle import _ckptfile, ckpt
from rekindle.ckpt import CheckpointError, Item, StorageError


def items(step=1, n=3):
    return [
        Item("model.fc1.weight", "F32", (2, 3), struct.pack("<6f", *[step + i / 8 for i in range(6)])),
        Item("model.fc1.bias", "F32", (2,), struct.pack("<2f", 0.5, -0.5)),
        Item("optim.m", "F64", (), struct.pack("<d", step / 3)),
        Item("rng.state", "U8", (n,), bytes(range(n))),
        Item("data.cursor", "I64", (1,), struct.pack("<q", step * 64)),
    ]


def flip(path, off, bit=0):
    if off < 0:
        off += os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ (1 << bit)]))


def header_of(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return n, f.read(n)


def write_raw(path, header_obj_or_bytes, data=b"", pad=True):
    h = header_obj_or_bytes
    if not isinstance(h, bytes):
        h = json.dumps(h, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + data)


class TestNames(unittest.TestCase):
    def test_names(self):
        self.assertEqual(ckpt.file_name(500), "ckpt-000000000500.safetensors")
        self.assertEqual(ckpt.file_name(10**13), "ckpt-10000000000000.safetensors")
        self.assertEqual(ckpt.name_step("ckpt-000000000500.safetensors"), 500)
        self.assertEqual(ckpt.name_step("ckpt-10000000000000.safetensors"), 10**13)
        for bad in ("ckpt-5.safetensors", "ckpt-0000000000005.safetensors", "ckpt-00000000050a.safetensors",
                    "ckpt-000000000500.safetensors.bak", "latest", "ckpt-99999999999999999999.safetensors"):
            self.assertIsNone(ckpt.name_step(bad), bad)
        self.assertEqual(ckpt.temp_pid("ckpt-000000000500.safetensors.tmp.42.0"), 42)
        self.assertEqual(ckpt.temp_pid("latest.tmp.7.13"), 7)
        for bad in ("latest.tmp.0.1", "latest.tmp.07.1", "notes.tmp.5.1", "latest.tmp.5", "latest.tmp.5.x"):
            self.assertIsNone(ckpt.temp_pid(bad), bad)
        self.assertEqual(ckpt.aside_step("ckpt-000000000600.safetensors.bad-1764590000"), 600)
        self.assertEqual(ckpt.aside_step("ckpt-000000000600.safetensors.bad-1764590000-2"), 600)
        self.assertIsNone(ckpt.aside_step("ckpt-000000000600.safetensors.bad-x"))


class TestRoundTrip(unittest.TestCase):
    def setUp(self):
        self.d = os.path.join(rktest.tmpdir(self), "run", "ck")  # parents made too

    def test_save_load(self):
        path = ckpt.save(self.d, 100, items(100), epoch=2, cursor=640, world_size=4,
                         config='{"model": "cnn", "batch": 64}')
        self.assertEqual(path, os.path.join(self.d, "ckpt-000000000100.safetensors"))
        with open(os.path.join(self.d, "latest")) as f:
            self.assertEqual(f.read(), "ckpt-000000000100.safetensors\n")
        c = ckpt.load(path)
        self.assertEqual((c.step, c.epoch, c.cursor, c.world_size), (100, 2, 640, 4))
        self.assertEqual(c.config, '{"model": "cnn", "batch": 64}')  # verbatim
        self.assertEqual(list(c.items), [it.name for it in items()])
        for it in items(100):
            self.assertEqual(c[it.name], it)
        self.assertEqual(c.metadata["format"], "rekindle-ckpt-1")
        n, h = header_of(path)
        self.assertEqual(n % 8, 0)
        self.assertTrue(h.startswith(b'{"__metadata__":{'))

    def test_every_dtype_and_odd_shapes(self):
        its = []
        for dt, size in ckpt.DTYPE_SIZE.items():
            its.append(Item(f"x.{dt}", dt, (3, 2), bytes(range(6 * size))))
        its += [Item("empty", "F32", (0, 4), b""), Item("scalar", "I32", (), b"\1\0\0\0"),
                Item("arr", "F32", (4,), array.array("f", [1, 2, 3, 4])),
                Item("le", "F32", (2,), (ctypes.c_float.__ctype_le__ * 2)(1, 2)),
                Item("ba", "U8", (2,), bytearray(b"ab")), Item("mv", "U8", (1,), memoryview(b"z")),
                Item("eight", "U8", (1,) * 8, b"q"), Item("caf\u00e9 \U0001f600", "U8", (1,), b"u")]
        c = ckpt.load(ckpt.save(self.d, 0, its))
        for it in its:
            self.assertEqual(bytes(c[it.name].data), bytes(memoryview(it.data).cast("B")))
            self.assertEqual(c[it.name].shape, it.shape)
        self.assertEqual(len(ckpt.load(ckpt.save(self.d, 1, [])).items), 0)
        c = ckpt.load(ckpt.save(self.d, 2, its[:1], config={"model": "x", "lr": 0.5}))
        self.assertEqual(c.config, '{"model":"x","lr":0.5}')
        self.assertFalse(c[its[0].name].data.readonly)

    def test_parse_from_memory(self):
        path = ckpt.save(self.d, 3, items(3))
        with open(path, "rb") as f:
            buf = f.read()
        c = ckpt.parse(buf, path)
        self.assertEqual(c.step, 3)
        with self.assertRaisesRegex(CheckpointError, "file name says 4"):
            ckpt.parse(buf, "ckpt-000000000004.safetensors")

    def test_step_checked_against_a_long_path(self):
        # messages cut a path to 400 characters; the step check takes the real file name
        d = os.path.join(self.d, *(["d" * 60] * 7))
        q = os.path.join(d, ckpt.file_name(300))
        os.rename(ckpt.save(d, 301, items(301)), q)
        self.assertGreater(len(q), 400)
        with self.assertRaisesRegex(CheckpointError, "field 'step' is 301 but the file name says 300"):
            ckpt.load(q)
        with open(q, "rb") as f:
            buf = f.read()
        with self.assertRaisesRegex(CheckpointError, "file name says 300"):
            ckpt.parse(buf, os.fsencode(q))

    def test_bad_arguments_change_nothing(self):
        good = items()
        cases = [
            dict(step=-1), dict(keep=0), dict(epoch=-1), dict(world_size=0), dict(config="{"),
            dict(config='{"a": NaN}'), dict(config='{"a": 1e999}'), dict(step=True),
            dict(items=good + [Item("rng.state", "U8", (1,), b"x")]),
            dict(items=[Item("__manifest__", "U8", (1,), b"x")]),
            dict(items=[Item("__metadata__", "U8", (1,), b"x")]),
            dict(items=[Item("", "U8", (1,), b"x")]),
            dict(items=[Item("a\0b", "U8", (1,), b"x")]),
            dict(items=[Item("a", "F32", (2,), b"x" * 7)]),
            dict(items=[Item("a", "F128", (1,), b"x" * 16)]),
            dict(items=[Item("a", "U8", (1,) * 9, b"x")]),
            dict(items=[Item("a", "U8", (-1,), b"")]),
            dict(items=[Item("a", "U8", (2,), memoryview(b"abcd")[::2])]),
            dict(items=[Item("a", "U8", (1,), "x")]),
            dict(items=[Item("model.w", "F32", (2,), (ctypes.c_float.__ctype_be__ * 2)(1, 2))]),
        ]
        for kw in cases:
            args = dict(step=5, items=good)
            args.update(kw)
            step, its = args.pop("step"), args.pop("items")
            with self.assertRaises(CheckpointError, msg=str(kw)[:80]):
                ckpt.save(self.d, step, its, **args)
            self.assertFalse(os.path.exists(self.d), kw)


class TestFinite(unittest.TestCase):
    def setUp(self):
        self.d = rktest.tmpdir(self)

    def test_nonfinite_index(self):
        rnd = random.Random(5)
        for dt, fmt in (("F32", "f"), ("F64", "d"), ("F16", "e")):
            vals = [rnd.uniform(-1e4, 1e4) for _ in range(3000)]
            data = bytearray(struct.pack(f"<{len(vals)}{fmt}", *vals))
            self.assertIsNone(ckpt.nonfinite_index(dt, data))
            size = struct.calcsize(fmt)
            for at, bad in ((0, "nan"), (2999, "inf"), (1777, "-inf")):
                d2 = bytearray(data)
                d2[at * size : (at + 1) * size] = struct.pack(f"<{fmt}", float(bad))
                self.assertEqual(ckpt.nonfinite_index(dt, d2), at)
                self.assertEqual(ckpt.nonfinite_name(dt, d2, at),
                                 {"nan": "NaN", "inf": "+inf", "-inf": "-inf"}[bad])
        bf = bytearray(struct.pack("<4f", 1.0, 2.0, float("inf"), 3.0))
        bf16 = bytes(b for i in range(4) for b in bf[4 * i + 2 : 4 * i + 4])  # the top halves
        self.assertEqual(ckpt.nonfinite_index("BF16", bf16), 2)
        self.assertIsNone(ckpt.nonfinite_index("U8", b"\xff" * 8))
        big = bytearray(struct.pack("<f", 1.0)) * (ckpt.SCAN_CHUNK + 10)
        big[4 * (ckpt.SCAN_CHUNK + 3) + 3] = 0x7F
        big[4 * (ckpt.SCAN_CHUNK + 3) + 2] = 0xC0
        self.assertEqual(ckpt.nonfinite_index("F32", big), ckpt.SCAN_CHUNK + 3)
        huge = array.array("f", [3e38]) * (ckpt.SCAN_CHUNK + 100)  # finite, but every top byte 0x7f
        self.assertIsNone(ckpt.nonfinite_index("F32", huge))
        for at in (1000, ckpt.SCAN_CHUNK + 50):
            h2 = array.array("f", huge)
            h2[at] = float("-inf")
            self.assertEqual(ckpt.nonfinite_index("F32", h2), at)

    def test_save_refuses_nonfinite_weights(self):
        ckpt.save(self.d, 10, items(10))
        before = sorted(os.listdir(self.d))
        for name in ("model.w", "optim.v"):
            for dt, raw in (("F32", struct.pack("<3f", 1, float("nan"), 2)),
                            ("F64", struct.pack("<3d", 1, 2, float("-inf"))),
                            ("F16", struct.pack("<3e", 1, 2, float("inf"))),
                            ("BF16", b"\x80\x3f\xc0\x7f\x00\x00")):
                with self.assertRaisesRegex(ckpt.NonFiniteError, rf"item '{name}': element \d is "):
                    ckpt.save(self.d, 20, [Item(name, dt, (3,), raw)])
        self.assertEqual(sorted(os.listdir(self.d)), before)
        # other items may hold anything
        ckpt.save(self.d, 20, [Item("rng.x", "F32", (1,), struct.pack("<f", float("nan")))])

    def test_load_refuses_nonfinite_weights(self):
        with mock.patch.object(_ckptfile, "must_be_finite", lambda name: False):
            p = ckpt.save(self.d, 7, [Item("model.w", "F32", (2,), struct.pack("<2f", 1, float("nan")))])
        with self.assertRaisesRegex(CheckpointError, r"tensor 'model.w': element 1 is NaN"):
            ckpt.load(p)


class TestLoadChecks(unittest.TestCase):
    def setUp(self):
        self.d = rktest.tmpdir(self)
        self.path = ckpt.save(self.d, 300, items(300))
        with open(self.path, "rb") as f:
            self.good = f.read()

    def refused(self, data, pattern, name=None):
        p = os.path.join(self.d, name or "ckpt-000000000300.safetensors")
        with open(p, "wb") as f:
            f.write(data)
        with self.assertRaisesRegex(CheckpointError, pattern) as cm:
            ckpt.load(p)
        self.assertIn(p, str(cm.exception))
        self.assertNotIn("\n", str(cm.exception))
        return str(cm.exception)

    def test_every_bit_flip_is_caught(self):
        for off in range(len(self.good)):
            for bit in range(8):
                b = bytearray(self.good)
                b[off] ^= 1 << bit
                with self.assertRaises(CheckpointError, msg=f"byte {off} bit {bit}"):
                    ckpt.parse(b, self.path)

    def test_data_checksum_names_tensor(self):
        b = bytearray(self.good)
        b[-1] ^= 1
        self.refused(bytes(b), r"tensor 'data.cursor': data checksum mismatch \(stored [0-9a-f]{16}, "
                     r"computed [0-9a-f]{16} over 8 bytes\)")

    def test_header_changes(self):
        n, h = header_of(self.path)
        meta = json.loads(h)
        def again(mutate, pattern, recompute=False):
            m = json.loads(h)
            mutate(m)
            write_raw(os.path.join(self.d, "x"), m)  # header only, same data
            with open(os.path.join(self.d, "x"), "rb") as f:
                nn = int.from_bytes(f.read(8), "little")
                hh = f.read(nn)
            self.refused(nn.to_bytes(8, "little") + hh + self.good[8 + n :], pattern)
        again(lambda m: m["__metadata__"].update(cursor="1"), "xxh64.__manifest__' does not match")
        again(lambda m: m["__metadata__"].update(step="301"), "field 'step' is 301 but the file name says 300")
        again(lambda m: m["__metadata__"].update(step="0300"), "field 'step' is '0300', not an integer")
        again(lambda m: m["__metadata__"].pop("xxh64.optim.m"), "tensor 'optim.m' has no checksum")
        again(lambda m: m["__metadata__"].update({"xxh64.ghost": "0" * 16}), "tensor 'ghost' is missing")
        again(lambda m: m["__metadata__"].update(format="rekindle-ckpt-2"), "field 'format' is 'rekindle-ckpt-2'")
        again(lambda m: m["__metadata__"].pop("format"), "not a rekindle checkpoint")
        again(lambda m: m["__metadata__"].update(config="{"), "field 'config' is not valid JSON")
        again(lambda m: m["__metadata__"].update(world_size="0"), "field 'world_size' is 0")
        again(lambda m: m["__metadata__"].update({"xxh64.optim.m": "ABCDEF0123456789"}), "not 16 hex digits")
        again(lambda m: m["__metadata__"].update(epoch=1), "value of 'epoch' is not a string")
        again(lambda m: m["optim.m"].update(dtype="F32"), r"'data_offsets' span 8 bytes but F32 \[\] needs 4")
        again(lambda m: m["optim.m"].update(dtype="X1"), "unknown dtype 'X1'")
        again(lambda m: m["optim.m"].update(extra=1), "unknown field 'extra'")
        again(lambda m: m["optim.m"].update(shape=[1.0]), r"'shape'\[0\] is not a non-negative integer")
        again(lambda m: m["optim.m"].update(shape=[1] * 9), "9 dimensions, more than 8")
        again(lambda m: m["optim.m"].update(shape=[2**40, 2**40]), "overflows")
        again(lambda m: m["optim.m"].update(data_offsets=[0, 8]), "overlap")
        again(lambda m: m["optim.m"].update(data_offsets=[10**9, 10**9 + 8]), "past the end of the data")
        again(lambda m: m["optim.m"].pop("data_offsets"), "missing field 'data_offsets'")
        again(lambda m: m.pop("rng.state"), "hole in the data section|tensor 'rng.state' is missing")
        del meta

    def test_bad_structure(self):
        self.refused(b"", "file is 0 bytes, shorter than the 8-byte header length")
        self.refused(b"\x05\0\0", "file is 3 bytes")
        self.refused((0).to_bytes(8, "little") + b"xx", "header length is 0")
        self.refused((10**8 + 1).to_bytes(8, "little") + b"{}", "over the limit of 100000000 bytes")
        self.refused((50).to_bytes(8, "little") + b"{}", "header length runs past the end of the file")
        self.refused((2).to_bytes(8, "little") + b"[]", r"header is not a JSON object \(no '\{' at byte 8\)")
        self.refused((4).to_bytes(8, "little") + b'{"\xff"', r"not valid UTF-8 \(byte 10\)")
        self.refused((2).to_bytes(8, "little") + b"{}" + b"\0" * 4, "data section is 4 bytes but the tensors cover only 0")
        for h in (b'{"a":NaN}', b'{"a":1e999}', b'{"a":' + b"[" * 100000 + b"]" * 100000 + b"}",
                  b'{"a":"\\u0000"}', b'{"a":"\\ud800"}', b'{"a":1}x', b'{"a":9223372036854775808}',
                  b'{"__metadata__":{},"__metadata__":{}}', b'{"a":{"dtype":"U8","dtype":"U8"}}'):
            self.refused(len(h).to_bytes(8, "little") + h, "header is not valid JSON|duplicate key")
        self.refused(self.good + b"\0", "data section is")
        self.refused(self.good[:-1], "data section|past the end")

    def test_not_regular_files(self):
        fifo = os.path.join(self.d, "ckpt-000000000400.safetensors")
        os.mkfifo(fifo)
        t = time.monotonic()
        with self.assertRaisesRegex(CheckpointError, "is a FIFO, not a regular file") as cm:
            ckpt.load(fifo)
        self.assertTrue(cm.exception.unreadable)
        self.assertLess(time.monotonic() - t, 2)
        os.unlink(fifo)
        os.mkdir(fifo)
        with self.assertRaisesRegex(CheckpointError, "is a directory"):
            ckpt.load(fifo)
        os.rmdir(fifo)
        os.symlink("/dev/zero", fifo)
        with self.assertRaisesRegex(CheckpointError, "is a character device"):
            ckpt.load(fifo)
        with self.assertRaisesRegex(CheckpointError, "does not exist"):
            ckpt.load(os.path.join(self.d, "nothing"))

    def test_bogus_header_of_a_huge_sparse_file_is_cheap(self):
        p = os.path.join(self.d, "sparse")
        write_raw(p, b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}')
        os.truncate(p, 3 << 30)
        t = time.monotonic()
        with self.assertRaisesRegex(CheckpointError, "data section is"):
            ckpt.load(p)
        self.assertLess(time.monotonic() - t, 2)  # 8 + N bytes read, not 3 GiB


class TestStore(unittest.TestCase):
    def setUp(self):
        self.d = rktest.tmpdir(self)

    def names(self):
        return sorted(os.listdir(self.d))

    def test_retention(self):
        for s in range(1, 7):
            ckpt.save(self.d, s * 100, items(s), keep=3)
        self.assertEqual([n for n in self.names() if ckpt.name_step(n) is not None],
                         [ckpt.file_name(s) for s in (400, 500, 600)])
        # a checkpoint that does not verify is kept and does not count
        flip(os.path.join(self.d, ckpt.file_name(500)), -1)
        for foreign in ("notes.txt", "ckpt-5.safetensors", ckpt.file_name(600) + ".bak"):
            open(os.path.join(self.d, foreign), "w").close()
        ckpt.save(self.d, 700, items(7), keep=2)
        self.assertEqual(self.names(), sorted([ckpt.file_name(500), ckpt.file_name(600),
                                               ckpt.file_name(700), "latest", "notes.txt",
                                               "ckpt-5.safetensors", ckpt.file_name(600) + ".bak"]))
        # a later timeline is never deleted by an earlier step's save, and does not count
        ckpt.save(self.d, 650, items(6), keep=1)
        self.assertIn(ckpt.file_name(700), self.names())
        self.assertIn(ckpt.file_name(500), self.names())  # still evidence
        self.assertNotIn(ckpt.file_name(600), self.names())
        with open(os.path.join(self.d, "latest")) as f:
            self.assertEqual(f.read(), ckpt.file_name(650) + "\n")

    def test_same_step_bad_file_is_moved_aside(self):
        p = ckpt.save(self.d, 600, items(6))
        ckpt.save(self.d, 600, items(6))  # a good one is replaced
        self.assertEqual(self.names(), [ckpt.file_name(600), "latest"])
        flip(p, -1)
        ckpt.save(self.d, 600, items(6))
        aside = [n for n in self.names() if ckpt.aside_step(n) is not None]
        self.assertEqual(len(aside), 1)
        self.assertTrue(aside[0].startswith(ckpt.file_name(600) + ".bad-"))
        self.assertEqual(ckpt.load(p).step, 600)
        flip(p, -1)
        ckpt.save(self.d, 600, items(6))  # the same second: "-1" appended
        self.assertEqual(len([n for n in self.names() if ckpt.aside_step(n) is not None]), 2)
        for s in (700, 800, 900, 1000):
            ckpt.save(self.d, s, items(s), keep=1)
        self.assertEqual(len([n for n in self.names() if ckpt.aside_step(n) is not None]), 2)

    def test_dead_writers_temporary_files_removed(self):
        dead = subprocess.Popen(["true"])
        dead.wait()
        alive = os.getppid()
        files = [ckpt.file_name(5) + f".tmp.{dead.pid}.0", f"latest.tmp.{dead.pid}.3",
                 ckpt.file_name(5) + f".tmp.{alive}.1", "other.tmp.%d.0" % dead.pid, ".lock"]
        for n in files:
            open(os.path.join(self.d, n), "w").close()
        ckpt.save(self.d, 10, items())
        left = self.names()
        self.assertNotIn(files[0], left)
        self.assertNotIn(files[1], left)
        for n in files[2:]:
            self.assertIn(n, left)

    def test_storage_errors(self):
        ckpt.save(self.d, 10, items())
        before = self.names()
        real_write = os.write
        for err in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS):
            def failing(fd, data, e=err):
                raise OSError(e, os.strerror(e))
            with mock.patch.object(os, "write", failing):
                with self.assertRaises(StorageError) as cm:
                    ckpt.save(self.d, 20, items())
            self.assertEqual(cm.exception.errno, err)
            self.assertIn("cannot write", str(cm.exception))
            self.assertEqual(self.names(), before)  # the temporary file is gone
        with mock.patch.object(os, "fsync", side_effect=OSError(errno.EIO, "I/O error")):
            with self.assertRaises(StorageError):
                ckpt.save(self.d, 20, items())
        with mock.patch.object(os, "write", side_effect=OSError(errno.EFBIG, "File too large")):
            with self.assertRaises(CheckpointError):
                ckpt.save(self.d, 20, items())
        with mock.patch.object(os, "mkdir", side_effect=OSError(errno.EROFS, "Read-only file system")):
            with self.assertRaises(StorageError) as cm:
                ckpt.save(os.path.join(self.d, "sub"), 1, items())
            self.assertEqual(cm.exception.errno, errno.EROFS)
        self.assertEqual(self.names(), before)
        self.assertIs(os.write, real_write)

    def test_failed_close_is_a_storage_error_closed_once(self):
        ckpt.save(self.d, 10, items())
        before = self.names()
        real_fsync, real_close = os.fsync, os.close
        synced, closes = [], []

        def fsync(fd):
            if stat.S_ISREG(os.fstat(fd).st_mode):
                synced.append(fd)
            return real_fsync(fd)

        def close(fd):
            if synced and fd == synced[-1]:
                closes.append(fd)
                real_close(fd)
                raise OSError(errno.EIO, "Input/output error")  # closed, as Linux does
            return real_close(fd)

        with mock.patch.object(os, "fsync", fsync), mock.patch.object(os, "close", close):
            with self.assertRaises(StorageError) as cm:
                ckpt.save(self.d, 20, items())
        self.assertEqual(cm.exception.errno, errno.EIO)
        self.assertIn("cannot close", str(cm.exception))
        self.assertEqual(len(closes), 1)  # not closed again by the cleanup (another thread's fd)
        self.assertEqual(self.names(), before)  # the temporary file is gone

    def test_directory_fsync_einval_is_ignored(self):
        real_fsync = os.fsync

        def fsync(fd):
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "Invalid argument")
            return real_fsync(fd)

        with mock.patch.object(os, "fsync", fsync):
            p = ckpt.save(os.path.join(self.d, "a", "b"), 10, items())
        self.assertEqual(ckpt.load(p).step, 10)
        with mock.patch.object(os, "fsync", side_effect=OSError(errno.EINVAL, "Invalid argument")):
            with self.assertRaises(CheckpointError):  # on the file itself it still counts
                ckpt.save(self.d, 20, items())

    def test_verified_table_is_thread_safe(self):
        # the table of files this process verified is bounded: threads adding at once must not
        # evict the same oldest entry twice (KeyError) or iterate it while it changes
        import threading
        from types import SimpleNamespace
        keys = itertools.count()
        fake = lambda p: SimpleNamespace(st_dev=0, st_ino=next(keys), st_size=0, st_mtime_ns=0)
        errors = []

        def run():
            try:
                for _ in range(3000):
                    ckpt._verified_add("x")
            except BaseException as e:  # noqa: B036
                errors.append(repr(e))

        old = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        try:
            with mock.patch.object(os, "stat", fake):
                ts = [threading.Thread(target=run) for _ in range(8)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
        finally:
            sys.setswitchinterval(old)
            ckpt._verified.clear()
        self.assertEqual(errors, [])
        self.assertLessEqual(len(ckpt._verified), ckpt._VERIFIED_MAX)

    def test_lock(self):
        lk = ckpt.lock(self.d, env={})
        self.assertTrue(lk.held)
        with open(os.path.join(self.d, ".lock")) as f:
            self.assertEqual(f.read(), f"{os.getpid()}\n")
        code = ("import sys; sys.path.insert(0, %r)\nfrom rekindle import ckpt\n"
                "try:\n    ckpt.lock(sys.argv[1], env={})\nexcept ckpt.LockedError as e:\n"
                "    print(e.holder, e); sys.exit(3)\nprint('took it')\n") % rktest.PYDIR
        r = subprocess.run([sys.executable, "-c", code, self.d], capture_output=True, text=True)
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertTrue(r.stdout.startswith(f"{os.getpid()} "))
        self.assertIn("another job writes to this checkpoint directory", r.stdout)
        with self.assertRaises(ckpt.LockedError):  # per open file: in this process too
            ckpt.lock(self.d, env={})
        with mock.patch.object(os, "pread", side_effect=OSError(errno.EIO, "Input/output error")):
            with self.assertRaises(ckpt.LockedError) as cm:  # the holder's pid unreadable
                ckpt.lock(self.d, env={})
        self.assertEqual(cm.exception.holder, 0)
        self.assertIn("its pid cannot be read: Input/output error", str(cm.exception))
        ckpt.unlock(lk)
        r = subprocess.run([sys.executable, "-c", code, self.d], capture_output=True, text=True)
        self.assertEqual(r.stdout.strip(), "took it")
        self.assertTrue(os.path.exists(os.path.join(self.d, ".lock")))
        under = ckpt.lock(self.d, env={"RK_HEARTBEAT": "/x", "RK_CKPT_DIR": self.d + "/"})
        self.assertFalse(under.held)
        other = ckpt.lock(os.path.join(self.d, "other"), env={"RK_HEARTBEAT": "/x", "RK_CKPT_DIR": self.d})
        self.assertTrue(other.held)
        ckpt.unlock(other)
        ckpt.unlock(under)
        ckpt.unlock(None)


class TestLoadLatest(unittest.TestCase):
    def setUp(self):
        self.d = rktest.tmpdir(self)
        for s in (100, 200, 300):
            ckpt.save(self.d, s, items(s))

    def test_latest(self):
        c, skipped = ckpt.load_latest(self.d)
        self.assertEqual((c.step, skipped), (300, []))
        self.assertEqual(ckpt.load_step(self.d, 200).step, 200)

    def test_falls_back_past_a_corrupt_newest(self):
        flip(os.path.join(self.d, ckpt.file_name(300)), -3)
        c, skipped = ckpt.load_latest(self.d)
        self.assertEqual(c.step, 200)
        self.assertEqual(len(skipped), 1)
        self.assertIn(ckpt.file_name(300) + ": tensor 'data.cursor': data checksum mismatch", skipped[0])
        flip(os.path.join(self.d, ckpt.file_name(200)), 9)
        c, skipped = ckpt.load_latest(self.d)
        self.assertEqual((c.step, len(skipped)), (100, 2))
        flip(os.path.join(self.d, ckpt.file_name(100)), 20)
        c, skipped = ckpt.load_latest(self.d)
        self.assertIsNone(c)
        self.assertEqual(len(skipped), 3)

    def test_latest_problems(self):
        lp = os.path.join(self.d, "latest")
        for content, why in ((b"", "is empty"), (b"\n", "is empty"), (b"x\0", "NUL"),
                             (b"../etc/passwd\n", "does not hold a checkpoint file name"),
                             (b"ckpt-000000000900.safetensors\n", "does not exist")):
            with open(lp, "wb") as f:
                f.write(content)
            c, skipped = ckpt.load_latest(self.d)
            self.assertEqual(c.step, 300, content)
            self.assertIn(why, skipped[0])
        with open(lp, "wb") as f:
            f.write(b"x" * 5000)
        c, skipped = ckpt.load_latest(self.d)
        self.assertEqual(c.step, 300)
        self.assertIn("more than the limit", skipped[0])
        os.unlink(lp)
        c, skipped = ckpt.load_latest(self.d)
        self.assertEqual(c.step, 300)
        self.assertIn("latest: missing", skipped[0])
        with open(lp, "w") as f:
            f.write(ckpt.file_name(200) + "\n")
        c, skipped = ckpt.load_latest(self.d)
        self.assertEqual(c.step, 200)  # `latest` wins; the newer file is reported
        self.assertIn("newer than the checkpoint 'latest' names", skipped[0])

    def test_expect_skips_another_model(self):
        ckpt.save(self.d, 400, items(4), config='{"model":"cnn","lr":1}', keep=10)
        mlp = {"config": {"model": "mlp"}}
        c, skipped = ckpt.load_latest(self.d, expect=mlp)
        self.assertIsNone(c)  # the others have config {}: no "model"
        self.assertIn("config 'model' is (absent), expected \"mlp\"", skipped[-1])
        for s in (500, 600):
            ckpt.save(self.d, s, items(s), config='{"model":"mlp","lr":1.0}', keep=10)
        ckpt.save(self.d, 700, items(7), config='{"model":"cnn"}', keep=10)
        c, skipped = ckpt.load_latest(self.d, expect=mlp)
        self.assertEqual(c.step, 600)
        self.assertIn(ckpt.file_name(700) + ": config 'model' is \"cnn\", expected \"mlp\"", skipped[0])
        c, skipped = ckpt.load_latest(self.d, expect={"config": {"lr": 1}})
        self.assertEqual(c.step, 400)  # 1.0 is not 1, as for jansson
        c, skipped = ckpt.load_latest(self.d, expect={"items": {"optim.m": ("F64", ())}})
        self.assertEqual(c.step, 700)
        c, skipped = ckpt.load_latest(self.d, expect={"items": {"model.fc1.bias": ("F32", (3,))}})
        self.assertIsNone(c)
        self.assertIn("tensor 'model.fc1.bias' is F32 [2], expected F32 [3]", skipped[0])
        with self.assertRaisesRegex(ckpt.MismatchError, "tensor 'ghost' is missing"):
            ckpt.check(ckpt.load_step(self.d, 700), {"items": {"ghost": ("U8", (1,))}})

    def test_empty_and_missing_directory(self):
        e = rktest.tmpdir(self)
        self.assertEqual(ckpt.load_latest(e), (None, []))
        self.assertEqual(ckpt.load_latest(os.path.join(e, "none")), (None, []))

    def test_unreadable_file_stops_the_fallback(self):
        bad = os.path.join(self.d, ckpt.file_name(300))
        real_open = os.open

        def deny(path, *a, **kw):
            if os.fspath(path) == bad:
                raise PermissionError(errno.EACCES, "Permission denied", path)
            return real_open(path, *a, **kw)

        with mock.patch.object(os, "open", deny):
            with self.assertRaises(StorageError) as cm:
                ckpt.load_latest(self.d)
        self.assertEqual(cm.exception.errno, errno.EACCES)
        self.assertIn("cannot be read is not skipped", str(cm.exception))
        os.unlink(bad)
        os.mkfifo(bad)
        with self.assertRaisesRegex(CheckpointError, "is a FIFO"):
            ckpt.load_latest(self.d)


    def test_out_of_memory_is_a_checkpoint_error(self):
        # a sparse 1 TiB file with a valid header: reading it whole cannot get the memory; under a
        # 3 GiB address-space limit every call ends in CheckpointError, never MemoryError
        N = 1 << 40
        hdr = {"__metadata__": {"format": "rekindle-ckpt-1"},
               "rng.x": {"dtype": "U8", "shape": [N], "data_offsets": [0, N]}}
        big = os.path.join(self.d, ckpt.file_name(400))
        write_raw(big, hdr)
        os.truncate(big, os.path.getsize(big) + N)
        script = r"""
import os, resource, struct, sys
sys.path.insert(0, sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from rekindle import ckpt
d, big = sys.argv[2], sys.argv[3]
one = [ckpt.Item("model.w", "F32", (1,), struct.pack("<f", 1))]
for name, fn in (("load", lambda: ckpt.load(big)), ("verify", lambda: ckpt.verify(big)),
                 ("load_latest", lambda: ckpt.load_latest(d)),
                 ("save 500 keep 1", lambda: ckpt.save(d, 500, one, keep=1)),
                 ("save 400", lambda: ckpt.save(d, 400, one, keep=1))):
    try:
        r = fn()
        print(name, "->", os.path.basename(r) if isinstance(r, str) else r)
    except ckpt.CheckpointError as e:
        print(name, "CheckpointError", e.unreadable, e)
    except BaseException as e:
        print(name, "raised", type(e).__name__, e)
"""
        # the store's newest valid checkpoint is 300; load_latest stops at 400 (it may be good)
        with open(os.path.join(self.d, "latest"), "w") as f:
            f.write(ckpt.file_name(400) + "\n")
        r = subprocess.run([sys.executable, "-c", script, rktest.PYDIR, self.d, big],
                           capture_output=True, text=True, timeout=600)
        lines = r.stdout.splitlines()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(lines), 5, r.stdout + r.stderr)
        self.assertRegex(lines[0], r"^load CheckpointError True .*: out of memory for \d+ bytes$")
        self.assertEqual(lines[1], "verify -> False")
        self.assertRegex(lines[2], "^load_latest CheckpointError True .*cannot be read is not")
        self.assertEqual(lines[3], "save 500 keep 1 -> " + ckpt.file_name(500))
        self.assertEqual(lines[4], "save 400 -> " + ckpt.file_name(400))  # the big one set aside
        with open(os.path.join(self.d, "latest")) as f:
            self.assertEqual(f.read(), ckpt.file_name(400) + "\n")
        self.assertTrue(any(n.startswith(ckpt.file_name(400) + ".bad-") for n in os.listdir(self.d)))


SAVER = r'''
import os, sys
sys.path.insert(0, sys.argv[1])
from rekindle import _ckptfile, ckpt
d, start = sys.argv[2], int(sys.argv[3])
step = start
print("ready", flush=True)
while True:
    blob = bytes([step % 251]) * (4 << 20)
    ckpt.save(d, step, [ckpt.Item("model.w", "U8", (len(blob),), blob),
                        ckpt.Item("rng.s", "I64", (), step.to_bytes(8, "little"))], keep=2)
    print(step, flush=True)
    step += 1
'''


class TestKilledSaves(unittest.TestCase):
    def test_sigkill_at_random_moments_leaves_latest_valid(self):
        d = rktest.tmpdir(self)
        script = os.path.join(d, "saver.py")
        with open(script, "w") as f:
            f.write(SAVER)
        store = os.path.join(d, "ck")
        rnd = random.Random(15)
        step, kills, deadline = 1, 0, time.monotonic() + 12
        # 12 s, at least 10 kills, and at least one save kept (120 s at most: a loaded machine)
        while ((time.monotonic() < deadline or kills < 10 or step == 1)
               and time.monotonic() < deadline + 108):
            p = subprocess.Popen([sys.executable, script, rktest.PYDIR, store, str(step)],
                                 stdout=subprocess.PIPE)
            p.stdout.readline()  # "ready": the saver has started (its imports take a while)
            # the kill at a random moment of its saves: the sleep is what is tested
            time.sleep(rnd.uniform(0.05, 0.6))
            p.send_signal(signal.SIGKILL)
            p.wait()
            p.stdout.close()
            kills += 1
            c, skipped = ckpt.load_latest(store)
            for n in os.listdir(store):  # no checkpoint name is ever torn
                if ckpt.name_step(n) is not None:
                    ckpt.load(os.path.join(store, n))
            if c is not None:  # a kill between the first file's rename and its `latest`
                # leaves no `latest` (said, and the newest file is used): never a torn file
                self.assertEqual(skipped, [s for s in skipped
                                           if "newer than" in s or s.endswith("/latest: missing")])
                self.assertEqual(bytes(c["model.w"].data[:1]), bytes([c.step % 251]))
                step = c.step + 1
            if kills > 60:
                break
        self.assertGreaterEqual(kills, 10)
        self.assertGreater(step, 1)


if __name__ == "__main__":
    unittest.main()
