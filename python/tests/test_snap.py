"""rekindle.snap, the node's snapshot store in Python, with real files: names, the job's
directory (0700, ours, never a link), put/get round trips with the bytes of encode(), two
generations per rank, the agreed step past staggered ranks, a flipped byte, a link and a FIFO,
dead writers' temporary files, the room rule; and against the C store (librekindle.so through
ctypes): a generation written by either is byte for byte the other's and verifies in both,
and both agree on the same step."""

import ctypes
import os
import stat
import struct
import subprocess
import sys
import unittest

import rktest
from rekindle import _ckptfile, snap
from rekindle.ckpt import CheckpointError, Item, NonFiniteError


def items(rank, step):
    return [
        Item("model.w", "F32", (2, 3), struct.pack("<6f", *[step + i / 4 + 100 * rank for i in range(6)])),
        Item("optim.m", "F32", (2, 3), struct.pack("<6f", *[-step / 2 - i for i in range(6)])),
        Item("rng.state", "U8", (9,), bytes((step * 31 + i * 7 + rank) % 256 for i in range(9))),
    ]


def put(d, rank, step):
    return snap.put(d, rank, step, items(rank, step), cursor=step * 8, world_size=3,
                    config='{"model":"mlp"}')


def flip(path, off):
    with open(path, "r+b") as f:
        f.seek(off, os.SEEK_END if off < 0 else os.SEEK_SET)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x10]))


def rktest_env(case, name, value):
    """Set os.environ[name] = value for the rest of the test (restored after it); returns a
    setter for later values."""
    old = os.environ.get(name)

    def restore():
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old

    case.addCleanup(restore)

    def setter(v):
        os.environ[name] = v

    setter(value)
    return setter


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


class TestNames(unittest.TestCase):
    def test_names_are_exact(self):
        self.assertEqual(snap.file_name(120), "snap-000000000120.safetensors")
        self.assertEqual(snap.name_step("snap-000000000120.safetensors"), 120)
        self.assertEqual(snap.name_step(snap.file_name(2**63 - 1)), 2**63 - 1)
        for bad in ("snap-5.safetensors", "snap-0000000000005.safetensors",
                    "ckpt-000000000005.safetensors", "snap-000000000005.safetensors.tmp.12.0",
                    "snap-00000000000x.safetensors", "snap-99999999999999999999.safetensors",
                    "snap-٠٠٠٠٠٠٠٠٠٠٠٥.safetensors", ""):
            self.assertIsNone(snap.name_step(bad), bad)
        self.assertEqual(snap._temp_target("snap-000000000005.safetensors.tmp.12.0"), 12)
        self.assertIsNone(snap._temp_target("ckpt-000000000005.safetensors.tmp.12.0"))
        with self.assertRaises(snap.SnapshotError):
            snap.file_name(-1)


class TestStore(unittest.TestCase):
    def setUp(self):
        self.tmp = rktest.tmpdir(self)
        self.d = snap.make_dir(self.tmp)

    def test_directory_is_0700_ours_and_never_a_link(self):
        st = os.lstat(self.d)
        self.assertTrue(stat.S_ISDIR(st.st_mode))
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o700)
        self.assertIn("/" + snap.DIR_PREFIX, self.d)
        with self.assertRaises(snap.SnapshotMissing):
            snap.make_dir(os.path.join(self.tmp, "missing"))
        plain = os.path.join(self.tmp, "plain")
        open(plain, "w").close()
        with self.assertRaisesRegex(snap.SnapshotError, "is a regular file, not a directory"):
            snap.make_dir(plain)
        opened = os.path.join(self.tmp, "open")
        os.mkdir(opened, 0o755)
        with self.assertRaisesRegex(snap.SnapshotError, "has mode 0755, not 0700"):
            put(opened, 0, 1)
        self.assertEqual(os.listdir(opened), [])
        link = os.path.join(self.tmp, "link")
        os.symlink(self.d, link)
        with self.assertRaisesRegex(snap.SnapshotError, "is a symbolic link, not a directory"):
            snap.check_dir(link)
        put(self.d, 0, 1)
        os.chmod(os.path.join(self.d, "rank-0"), 0o750)
        with self.assertRaisesRegex(snap.SnapshotError, "rank-0: has mode 0750, not 0700"):
            snap.get(self.d, 0, 1)
        os.chmod(os.path.join(self.d, "rank-0"), 0o700)
        os.symlink(os.path.join(self.d, "rank-0"), os.path.join(self.d, "rank-1"))
        with self.assertRaisesRegex(snap.SnapshotError, "rank-1: is a symbolic link"):
            snap.get(self.d, 1, 1)
        os.unlink(os.path.join(self.d, "rank-1"))

    def test_round_trip_with_the_bytes_of_encode(self):
        p = put(self.d, 2, 5)
        c = snap.get(self.d, 2, 5)
        self.assertEqual((c.step, c.cursor, c.world_size, c.config), (5, 40, 3, '{"model":"mlp"}'))
        self.assertEqual(list(c.items.values()), items(2, 5))
        hdr, views = _ckptfile.encode(5, items(2, 5), cursor=40, world_size=3,
                                      config='{"model":"mlp"}')
        with open(p, "rb") as f:
            self.assertEqual(f.read(), hdr + b"".join(bytes(v) for v in views))
        self.assertEqual(stat.S_IMODE(os.lstat(p).st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(os.lstat(os.path.dirname(p)).st_mode), 0o700)
        self.assertEqual(snap.bytes_held(self.d), os.path.getsize(p))
        with self.assertRaisesRegex(snap.SnapshotMissing, "no snapshot of step 6"):
            snap.get(self.d, 2, 6)
        with self.assertRaises(snap.SnapshotMissing):
            snap.get(self.d, 0, 5)
        self.assertEqual(snap.steps(self.d, 0), [])
        bad = items(0, 1)
        bad[0] = Item("model.w", "F32", (1,), struct.pack("<f", float("nan")))
        with self.assertRaises(NonFiniteError):
            snap.put(self.d, 7, 1, bad)
        self.assertFalse(os.path.exists(os.path.join(self.d, "rank-7")))
        snap.remove_dir(self.d)
        self.assertFalse(os.path.exists(self.d))

    def test_two_generations_and_a_rollback_drops_the_newer(self):
        for s in range(1, 6):
            put(self.d, 0, s)
        self.assertEqual(snap.steps(self.d, 0), [5, 4])
        self.assertEqual(sorted(os.listdir(os.path.join(self.d, "rank-0"))),
                         [snap.file_name(4), snap.file_name(5)])
        put(self.d, 0, 5)
        self.assertEqual(snap.steps(self.d, 0), [5, 4])
        put(self.d, 0, 2)
        self.assertEqual(snap.steps(self.d, 0), [2])
        put(self.d, 0, 3)
        self.assertEqual(snap.steps(self.d, 0), [3, 2])

    def test_a_put_writes_over_the_generation_it_drops(self):
        """As the C store (test_snap's test of the same name): the generation retention drops
        becomes the new copy's file, written over and cut to its length; what is read back is
        the new generation only, a longer one first and a shorter one after."""
        rd = os.path.join(self.d, "rank-0")
        big = items(0, 1) + [Item("model.big", "F32", (4096,), struct.pack("<4096f", *range(4096)))]
        snap.put(self.d, 0, 1, big, world_size=3)
        put(self.d, 0, 2)
        held = os.open(os.path.join(rd, snap.file_name(1)), os.O_RDONLY)  # its inode stays ours
        self.addCleanup(os.close, held)
        p3 = put(self.d, 0, 3)
        st = os.fstat(held)
        self.assertEqual((st.st_ino, st.st_nlink), (os.lstat(p3).st_ino, 1),
                         "step 3 was not written over step 1's file")
        self.assertEqual(snap.steps(self.d, 0), [3, 2])
        self.assertEqual(list(snap.get(self.d, 0, 3).items.values()), items(0, 3))
        hdr, views = _ckptfile.encode(3, items(0, 3), cursor=24, world_size=3, config='{"model":"mlp"}')
        self.assertEqual(os.path.getsize(p3), len(hdr) + sum(v.nbytes for v in views))
        self.assertEqual(sorted(os.listdir(rd)), [snap.file_name(2), snap.file_name(3)])
        # a link under a generation's name is removed, never written through
        target = os.path.join(self.tmp, "target")
        with open(target, "wb") as f:
            f.write(b"keep")
        os.unlink(os.path.join(rd, snap.file_name(2)))
        os.symlink(target, os.path.join(rd, snap.file_name(2)))
        put(self.d, 0, 4)
        with open(target, "rb") as f:
            self.assertEqual(f.read(), b"keep")
        self.assertEqual(snap.steps(self.d, 0), [4, 3])

    def test_a_pin_is_a_link_whose_bytes_survive_the_puts(self):
        """snap.pin: pin-<step> is a hard link to the generation; the puts after it unlink the
        pinned generation instead of writing over it, so the pin's bytes stay; it removes no
        other pin (rk run does, after reading them); a missing step is SnapshotMissing."""
        rd = os.path.join(self.d, "rank-0")
        p5 = put(self.d, 0, 5)
        with open(p5, "rb") as f:
            before = f.read()
        snap.pin(self.d, 0, 5)
        pin = os.path.join(rd, snap.pin_name(5))
        self.assertEqual(os.lstat(pin).st_ino, os.lstat(p5).st_ino)
        snap.pin(self.d, 0, 5)  # again: nothing changes
        for st in (6, 7, 8):
            put(self.d, 0, st)
        self.assertFalse(os.path.exists(p5))
        with open(pin, "rb") as f:
            self.assertEqual(f.read(), before)
        self.assertEqual(snap.steps(self.d, 0), [8, 7])  # Python's store lists generations only
        snap.pin(self.d, 0, 7)
        snap.pin(self.d, 0, 8)
        self.assertEqual(sorted(n for n in os.listdir(rd) if n.startswith("pin-")),
                         [snap.pin_name(5), snap.pin_name(7), snap.pin_name(8)])
        with self.assertRaises(snap.SnapshotMissing):
            snap.pin(self.d, 0, 6)

    def test_dead_writers_temporary_files_go_live_ones_stay(self):
        put(self.d, 0, 1)
        rd = os.path.join(self.d, "rank-0")
        dead = f"{snap.file_name(2)}.tmp.{dead_pid()}.0"
        live = f"{snap.file_name(2)}.tmp.{os.getppid()}.0"
        for n in (dead, live):
            with open(os.path.join(rd, n), "wb") as f:
                f.write(b"torn")
        self.assertEqual(snap.steps(self.d, 0), [1])
        self.assertEqual(snap.agree(self.d, 1), (1, []))
        put(self.d, 0, 2)
        self.assertEqual(sorted(n for n in os.listdir(rd) if ".tmp." in n), [live])
        os.unlink(os.path.join(rd, live))

    def test_raw_and_from_bytes(self):
        """Rank 0's generation sent as bytes to a rank on another node (raw) and verified where
        it arrives (from_bytes)."""
        put(self.d, 1, 6)
        put(self.d, 1, 7)
        flip(os.path.join(self.d, "rank-1", snap.file_name(7)), -2)
        buf = snap.raw(self.d, 1, 6)
        self.assertIsInstance(buf, bytearray)
        c = snap.from_bytes(buf, 6, "sent")
        self.assertEqual((c.step, c.path), (6, "sent"))
        self.assertEqual(bytes(c.items["rng.state"].data), bytes(snap.get(self.d, 1, 6).items["rng.state"].data))
        with self.assertRaisesRegex(CheckpointError, "field 'step' is 6 but the file name says 5"):
            snap.from_bytes(buf, 5, "sent")
        bad = bytearray(buf)
        bad[-2] ^= 0xFF
        with self.assertRaisesRegex(CheckpointError, "data checksum mismatch"):
            snap.from_bytes(bad, 6, "sent")
        # raw() does not verify: the flipped generation's bytes come as they are
        p7 = os.path.join(self.d, "rank-1", snap.file_name(7))
        self.assertEqual(len(snap.raw(self.d, 1, 7)), os.path.getsize(p7))
        with self.assertRaises(snap.SnapshotMissing):
            snap.raw(self.d, 1, 9)

    def test_agree_staggered_flipped_link_and_fifo(self):
        for s in range(1, 5):
            put(self.d, 0, s)
            put(self.d, 2, s)
            if s <= 3:
                put(self.d, 1, s)
        self.assertEqual(snap.agree(self.d, 3), (3, []))
        self.assertEqual(snap.agree(self.d, 1), (4, []))
        self.assertEqual(snap.agree(self.d, 4), (None, []))
        put(self.d, 1, 4)
        self.assertEqual(snap.agree(self.d, 3), (4, []))
        p = os.path.join(self.d, "rank-1", snap.file_name(4))
        flip(p, -2)
        with self.assertRaisesRegex(CheckpointError, "tensor 'rng.state': data checksum mismatch"):
            snap.get(self.d, 1, 4)
        step, skipped = snap.agree(self.d, 3)
        self.assertEqual(step, 3)
        self.assertEqual(len(skipped), 1)
        self.assertIn("rank-1/snap-000000000004.safetensors: tensor 'rng.state'", skipped[0])
        # a link to a valid copy, and a FIFO, in place of generations
        q = os.path.join(self.tmp, "outside")
        os.rename(os.path.join(self.d, "rank-0", snap.file_name(3)), q)
        os.symlink(q, os.path.join(self.d, "rank-0", snap.file_name(3)))
        with self.assertRaisesRegex(snap.SnapshotError, "is a symbolic link, not a regular file"):
            snap.get(self.d, 0, 3)
        os.unlink(os.path.join(self.d, "rank-2", snap.file_name(4)))
        os.mkfifo(os.path.join(self.d, "rank-2", snap.file_name(4)), 0o600)
        with self.assertRaisesRegex(snap.SnapshotError, "is a FIFO, not a regular file"):
            snap.get(self.d, 2, 4)
        self.assertEqual(snap.steps(self.d, 0), [4])
        self.assertEqual(snap.agree(self.d, 3)[0], None)
        put(self.d, 0, 5)  # removes the link (not its target)
        self.assertEqual(snap.steps(self.d, 0), [5, 4])
        self.assertTrue(os.path.exists(q))
        # a generation whose content says another step than its name
        os.rename(os.path.join(self.d, "rank-2", snap.file_name(3)),
                  os.path.join(self.d, "rank-2", snap.file_name(9)))
        with self.assertRaisesRegex(CheckpointError, "field 'step' is 3 but the file name says 9"):
            snap.get(self.d, 2, 9)

    def test_room_rule(self):
        self.assertEqual(snap.room(self.d, 4096, 4), (True, ""))
        ok, why = snap.room(self.d, 1 << 50, 2)
        self.assertFalse(ok)
        self.assertIn("2 generations x 2 ranks x 1073741824.0 MiB", why)
        self.assertIn("MiB short", why)

    def test_room_needs_the_ram_too(self):
        # tmpfs pages are RAM: 4 KiB generations fit the tmpfs, not 1 byte of MemAvailable
        env = rktest_env(self, snap.MEMAVAIL_ENV, "1")
        ok, why = snap.room(self.d, 4096, 4)
        self.assertFalse(ok)
        self.assertIn("of RAM", why)
        self.assertIn(f"MemAvailable, from {snap.MEMAVAIL_ENV}", why)
        # the edge: need + margin (a tenth of MemTotal, at least 64 MiB) == available + held
        put(self.d, 0, 1)
        put(self.d, 1, 1)
        held = snap.bytes_held(self.d)
        gen = held // 2
        margin = max(snap.MARGIN_MIN, snap._mem_info()[1] // snap.MARGIN_DIV)
        env(str(4 * gen + margin - held))
        self.assertEqual(snap.room(self.d, gen, 2), (True, ""))
        env(str(4 * gen + margin - held - 1))
        ok, why = snap.room(self.d, gen, 2)
        self.assertFalse(ok)
        self.assertIn("of RAM", why)
        env("12G")
        with self.assertRaisesRegex(snap.SnapshotError, snap.MEMAVAIL_ENV + "='12G'"):
            snap.room(self.d, 4096, 1)

    def test_remove_keeps_foreign_files(self):
        put(self.d, 0, 1)
        put(self.d, 1, 1)
        notes = os.path.join(self.d, "rank-1", "notes.txt")
        open(notes, "w").close()
        with self.assertRaisesRegex(snap.SnapshotError, "rank-1: cannot remove"):
            snap.remove_dir(self.d)
        self.assertTrue(os.path.exists(notes))
        self.assertFalse(os.path.exists(os.path.join(self.d, "rank-0")))
        os.unlink(notes)
        snap.remove_dir(self.d)
        self.assertFalse(os.path.exists(self.d))

    def test_rng_slots_two_by_parity_keyed_and_torn_writes_refused(self):
        w = snap.RngSlot(self.d, 2)
        self.addCleanup(w.close)
        path = os.path.join(self.d, snap.CACHE_NAME, snap.rng_slot_name(2))
        self.assertEqual(stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode), 0o700)
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        with self.assertRaises(snap.SnapshotMissing):  # nothing written yet
            snap.rng_slot_read(self.d, 2, 7, 1, 9)
        w.write(7, 1, 9, b"torch-7" * 700, b"cuda7")
        w.write(8, 1, 10, b"torch-8" * 700)
        self.assertEqual(snap.rng_slot_read(self.d, 2, 7, 1, 9), (b"torch-7" * 700, b"cuda7", b"", b""))
        self.assertEqual(snap.rng_slot_read(self.d, 2, 8, 1, 10), (b"torch-8" * 700, b"", b"", b""))
        # another step, launch or attempt in the slot: missing, named
        for step, launch, serial in ((9, 1, 9), (7, 2, 9), (7, 1, 11)):
            with self.assertRaisesRegex(snap.SnapshotMissing, "holds step 7 .launch 1, attempt 9."):
                snap.rng_slot_read(self.d, 2, step, launch, serial)
        w.write(9, 1, 11, b"torch-9" * 700)  # slot 1 again: step 7 is gone, step 8 stays
        with self.assertRaises(snap.SnapshotMissing):
            snap.rng_slot_read(self.d, 2, 7, 1, 9)
        self.assertEqual(snap.rng_slot_read(self.d, 2, 8, 1, 10)[0], b"torch-8" * 700)
        flip(path, 60 + 100)  # a byte of step 8's states (slot 0): a torn write
        with self.assertRaisesRegex(snap.SnapshotError, "fails its CRC"):
            snap.rng_slot_read(self.d, 2, 8, 1, 10)
        with self.assertRaisesRegex(ValueError, "do not fit"):
            w.write(10, 1, 12, b"x" * w.size)
        with self.assertRaisesRegex(ValueError, "at most"):
            snap.RngSlot(self.d, 2, snap.RNG_SLOT_EXTRA_MAX + 1)
        # never through a link, never another kind of file; none for another rank
        os.unlink(path)
        os.symlink(self.d + ".elsewhere", path)
        with self.assertRaises(snap.SnapshotError):
            snap.rng_slot_read(self.d, 2, 9, 1, 11)
        with self.assertRaises(snap.SnapshotError):
            snap.RngSlot(self.d, 2)
        os.unlink(path)
        os.mkfifo(path, 0o600)
        with self.assertRaisesRegex(snap.SnapshotError, "not a regular file"):
            snap.rng_slot_read(self.d, 2, 9, 1, 11)
        os.unlink(path)
        with self.assertRaises(snap.SnapshotMissing):
            snap.rng_slot_read(self.d, 3, 9, 1, 11)
        snap.RngSlot(self.d, 2).close()  # the cache goes with the directory
        snap.remove_dir(self.d)
        self.assertFalse(os.path.exists(self.d))

    def test_rng_slot_with_buffers_read_in_slots_of_the_same_size(self):
        bufs = bytes(range(256)) * 100  # 25,600 bytes: slot 1 starts past 16 KiB
        w = snap.RngSlot(self.d, 0, len(bufs))
        self.addCleanup(w.close)
        w.write(4, 3, 5, b"t4", b"", bufs)
        w.write(5, 3, 6, b"t5", b"c5", bufs[::-1], b"numpy and random")
        self.assertEqual(snap.rng_slot_read(self.d, 0, 4, 3, 5, len(bufs)), (b"t4", b"", bufs, b""))
        self.assertEqual(snap.rng_slot_read(self.d, 0, 5, 3, 6, len(bufs)),
                         (b"t5", b"c5", bufs[::-1], b"numpy and random"))
        self.assertEqual((w.size, snap.rng_slot_size()), (45056, 20480))  # 4 KiB pages
        with self.assertRaisesRegex(snap.SnapshotError, "was written 45056 bytes long, not 20480"):
            snap.rng_slot_read(self.d, 0, 4, 3, 5)  # read as slots without buffers
        with self.assertRaisesRegex(ValueError, "do not fit"):
            w.write(6, 3, 7, b"t6", b"", b"x" * w.size)

    def test_remove_takes_the_cache_and_never_follows_its_links(self):
        put(self.d, 0, 1)
        cache = os.path.join(self.d, snap.CACHE_NAME)
        os.mkdir(cache, 0o700)
        open(os.path.join(cache, "idx-0123.safetensors"), "w").close()
        outside = self.d + ".outside"
        open(outside, "w").close()
        self.addCleanup(os.unlink, outside)
        os.symlink(outside, os.path.join(cache, "idx-link.safetensors"))
        snap.remove_dir(self.d)
        self.assertFalse(os.path.exists(self.d))
        self.assertTrue(os.path.exists(outside))


class Err(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("msg", ctypes.c_char * 512)]


class Meta(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("epoch", ctypes.c_int64), ("cursor", ctypes.c_int64),
                ("world_size", ctypes.c_int), ("config_json", ctypes.c_char_p)]


class CItem(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_char_p), ("ndim", ctypes.c_int),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("data", ctypes.c_void_p)]


class CSnap:
    """The C store (src/runtime/snap.c) through librekindle.so."""

    def __init__(self, path):
        c = self.lib = ctypes.CDLL(path)
        P, E = ctypes.POINTER, ctypes.POINTER(Err)
        c.rk_snap_put.argtypes = [ctypes.c_char_p, ctypes.c_int, P(Meta), P(CItem), ctypes.c_size_t, E]
        c.rk_snap_get.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int64,
                                  P(ctypes.c_void_p), E]
        c.rk_snap_agree.argtypes = [ctypes.c_char_p, ctypes.c_int, P(ctypes.c_int64),
                                    ctypes.c_char_p, ctypes.c_size_t, E]
        c.rk_snap_steps.argtypes = [ctypes.c_char_p, ctypes.c_int, P(ctypes.c_int64),
                                    ctypes.c_size_t, P(ctypes.c_size_t), E]
        c.rk_snap_dir_make.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, E]
        c.rk_snap_room.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int,
                                   P(ctypes.c_int), ctypes.c_char_p, ctypes.c_size_t, E]
        c.rk_ckpt_meta_of.argtypes = [ctypes.c_void_p]
        c.rk_ckpt_meta_of.restype = P(Meta)
        c.rk_ckpt_free.argtypes = [ctypes.c_void_p]

    def put(self, d, rank, step, its, **kw):
        keep = []
        arr = (CItem * len(its))()
        for k, it in enumerate(its):
            shape = (ctypes.c_int64 * max(1, len(it.shape)))(*it.shape)
            data = ctypes.create_string_buffer(bytes(it.data), max(1, len(bytes(it.data))))
            keep += [shape, data]
            arr[k] = CItem(it.name.encode(), it.dtype.encode(), len(it.shape), shape,
                           ctypes.cast(data, ctypes.c_void_p))
        m = Meta(step, kw.get("epoch", 0), kw.get("cursor", 0), kw.get("world_size", 1),
                 kw.get("config", "{}").encode())
        e = Err()
        rc = self.lib.rk_snap_put(d.encode(), rank, ctypes.byref(m), arr, len(its), ctypes.byref(e))
        return rc, e.msg.decode()

    def get(self, d, rank, step):
        h, e = ctypes.c_void_p(), Err()
        rc = self.lib.rk_snap_get(d.encode(), rank, step, ctypes.byref(h), ctypes.byref(e))
        if rc:
            return rc, e.msg.decode()
        s = self.lib.rk_ckpt_meta_of(h).contents.step
        self.lib.rk_ckpt_free(h)
        return 0, s

    def agree(self, d, world):
        s, e = ctypes.c_int64(), Err()
        rep = ctypes.create_string_buffer(4096)
        rc = self.lib.rk_snap_agree(d.encode(), world, ctypes.byref(s), rep, 4096, ctypes.byref(e))
        return rc, s.value, rep.value.decode()

    def steps(self, d, rank):
        v, n, e = (ctypes.c_int64 * 8)(), ctypes.c_size_t(), Err()
        rc = self.lib.rk_snap_steps(d.encode(), rank, v, 8, ctypes.byref(n), ctypes.byref(e))
        return list(v[: n.value]) if rc == 0 else (rc, e.msg.decode())

    def room(self, d, bytes_per_gen, ranks):
        ok, e, why = ctypes.c_int(), Err(), ctypes.create_string_buffer(1024)
        rc = self.lib.rk_snap_room(d.encode(), bytes_per_gen, ranks, ctypes.byref(ok), why, 1024,
                                   ctypes.byref(e))
        return (rc, e.msg.decode()) if rc else (bool(ok.value), why.value.decode())

    def make_dir(self, parent):
        out, e = ctypes.create_string_buffer(4096), Err()
        rc = self.lib.rk_snap_dir_make(parent.encode(), out, 4096, ctypes.byref(e))
        return rc, out.value.decode()


@unittest.skipIf(rktest.librekindle() is None, "librekindle.so not built")
class TestAgainstC(unittest.TestCase):
    def setUp(self):
        self.c = CSnap(rktest.librekindle())
        self.tmp = rktest.tmpdir(self)

    def test_each_reads_the_others_generations_byte_for_byte(self):
        rc, d = self.c.make_dir(self.tmp)  # made by C, written by both
        self.assertEqual(rc, 0, d)
        snap.check_dir(d)
        kw = dict(cursor=40, world_size=2, config='{"model":"mlp"}')
        for s in (4, 5):
            snap.put(d, 0, s, items(0, s), **kw)  # Python writes rank 0
            self.assertEqual(self.c.put(d, 1, s, items(0, s), **kw), (0, ""))  # C rank 1
        with open(os.path.join(d, "rank-0", snap.file_name(5)), "rb") as a, \
                open(os.path.join(d, "rank-1", snap.file_name(5)), "rb") as b:
            self.assertEqual(a.read(), b.read())
        self.assertEqual(self.c.get(d, 0, 5), (0, 5))  # C reads Python's
        self.assertEqual(list(snap.get(d, 1, 5).items.values()), items(0, 5))  # Python reads C's
        self.assertEqual(self.c.steps(d, 0), [5, 4])
        self.assertEqual(snap.steps(d, 1), [5, 4])
        self.assertEqual(self.c.agree(d, 2), (0, 5, ""))
        self.assertEqual(snap.agree(d, 2), (5, []))
        # a flipped byte in Python's generation: both refuse it and agree on 4
        flip(os.path.join(d, "rank-0", snap.file_name(5)), -2)
        rc, msg = self.c.get(d, 0, 5)
        self.assertNotEqual(rc, 0)
        self.assertIn("tensor 'rng.state': data checksum mismatch", msg)
        rc, s, rep = self.c.agree(d, 2)
        self.assertEqual((rc, s), (0, 4))
        self.assertIn("rank-0/snap-000000000005.safetensors: tensor 'rng.state'", rep)
        self.assertEqual(snap.agree(d, 2)[0], 4)
        # Python's directory is one C accepts, and a dead writer's temporary file left by one
        # is removed by the other's next put
        d2 = snap.make_dir(self.tmp)
        snap.put(d2, 0, 1, items(0, 1))
        rd = os.path.join(d2, "rank-0")
        open(os.path.join(rd, f"{snap.file_name(2)}.tmp.{dead_pid()}.3"), "wb").close()
        self.assertEqual(self.c.put(d2, 0, 2, items(0, 2)), (0, ""))
        self.assertEqual(sorted(os.listdir(rd)), [snap.file_name(1), snap.file_name(2)])
        self.assertEqual(snap.get(d2, 0, 2).step, 2)

    def test_a_python_pin_is_a_pin_to_c(self):
        """rk run reads the ranks' pins (rk_snap_to_ckpt through rk_snap_get): C lists and
        reads a generation pinned by snap.pin after the generation itself rolled away."""
        rc, d = self.c.make_dir(self.tmp)
        self.assertEqual(rc, 0, d)
        put(d, 0, 5)
        snap.pin(d, 0, 5)
        put(d, 0, 6)
        put(d, 0, 7)
        self.assertEqual(self.c.steps(d, 0), [7, 6, 5])
        self.assertEqual(self.c.get(d, 0, 5), (0, 5))

    def test_room_gives_the_same_answer_in_both(self):
        d = snap.make_dir(self.tmp)
        snap.put(d, 0, 1, items(0, 1))
        env = rktest_env(self, snap.MEMAVAIL_ENV, "1")
        for value in ("1", "67108864", str(1 << 40)):
            env(value)  # os.environ writes through to the C library's environment
            for b in (4096, 1 << 50):
                self.assertEqual(self.c.room(d, b, 2), snap.room(d, b, 2), (value, b))


if __name__ == "__main__":
    unittest.main()
