"""rekindle.torch's snapshots in memory (docs/recovery.md, "Relaunch from memory", PyTorch), in
one process (a gloo group of one): K's rule, a put every K steps, a resume from memory that is
exact and wins only when at least as new as the disk, a copy torn by a SIGKILL and a
generation whose checksum fails never restored, and one snapshot_off (room short, a put that
fails) with the job going on, disk only. Skips without torch."""

import errno
import os
import signal
import subprocess
import sys
import unittest
from unittest import mock

import rktest  # noqa: F401  (python/ first on sys.path)

try:
    import numpy as np
    import torch
    import torch.distributed as dist
    import xxhash  # noqa: F401
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError as e:  # pragma: no cover
    raise unittest.SkipTest(f"SKIP: torch, numpy or xxhash missing ({e})")

import rekindle.torch as rkt  # noqa: E402  (outside the skip: a missing module is a failure)
from rekindle import ckpt, snap  # noqa: E402
try:
    from rekindle.torch import _memory
except ImportError:  # a failure of the tests below, not a skip
    _memory = None

N, BATCH, STEPS = 256, 32, 60
PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train(steps, env, stop_at=None, nan=(None, 0), **kw):
    """A small MLP under a Job with `env`; `stop_at`: the process 'dies' there (the loop is left
    without the Job's end: no final checkpoint); `nan`: (step, times) a NaN loss there, that many
    attempts. Returns (job, events, params hash)."""
    nan_at, nan_left = nan
    old = dict(os.environ)
    os.environ.update(env)
    try:
        torch.manual_seed(3)
        np.random.seed(3)
        g = torch.Generator().manual_seed(7)
        x = torch.randn(N, 12, generator=g)
        y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
        model = DDP(torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, 10, 0.9)
        job = rkt.Job(model, opt, global_batch=BATCH, data_size=N, name="mlp", verbose=False, scheduler=sched,
                      **kw)
        events = []
        job.w.event = lambda step, kind, **k: events.append((step, kind, k))
        for step in job.steps(steps):
            if step == stop_at:
                break
            per = N // BATCH
            idx = torch.from_numpy(np.random.default_rng([1, step // per]).permutation(N)[
                (step % per) * BATCH:(step % per + 1) * BATCH])
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            if step == nan_at and nan_left > 0:
                nan_left -= 1
                loss = loss * float("nan")
            job.scale(loss, len(idx)).backward()
            job.step()
            sched.step()
        if stop_at is not None:  # what the process's death would release
            if job._lock is not None:
                ckpt.unlock(job._lock)
                job._lock = None
            sys.excepthook = job._prev_hook
        return job, events, rkt.params_hash(model.module)
    finally:
        os.environ.clear()
        os.environ.update(old)


class Every(unittest.TestCase):
    def setUp(self):
        self.assertIsNotNone(_memory, "rekindle.torch._memory is missing")

    def test_rule(self):
        # K = 1 when a put costs at most 1 % of a step; else the smallest K meeting it; capped
        self.assertEqual(_memory.snap_every(0.001, 0.1, 50), 1)
        self.assertEqual(_memory.snap_every(0.00101, 0.1, 50), 2)
        self.assertEqual(_memory.snap_every(0.01, 0.1, 50), 10)
        self.assertEqual(_memory.snap_every(1.0, 0.1, 50), 50)
        self.assertEqual(_memory.snap_every(0.0, 0.1, 50), 1)
        self.assertEqual(_memory.snap_every(0.01, 0.0, 7), 7)  # no step time: the cap
        # the disk checkpoints' steps (every 50) put too, counted in the 1 %: the example's
        # 1.8 ms put and 9.6 ms step gave K 19 (puts at 19, 38, 50, 69, ...: 1.1 %), now 25
        self.assertEqual(_memory.snap_every(0.0018, 0.0096, 50), 19)
        self.assertEqual(_memory.snap_every(0.0018, 0.0096, 50, 50), 25)
        self.assertEqual(_memory.snap_every(0.00009, 0.0096, 50, 50), 1)
        self.assertEqual(_memory.snap_every(0.0, 0.0096, 50, 50), 1)
        self.assertEqual(_memory.snap_every(0.0096, 0.0096, 50, 50), 50)  # the forced alone: 2 %
        for i in range(40):
            put = 0.0001 * 1.2 ** i
            k = _memory.snap_every(put, 0.0096, 50, 50)
            puts, budget = 49 // k + 1, 0.5 * 0.0096 / put
            self.assertTrue(puts <= budget or k == 50, (put, k))
            if k > 1:
                self.assertGreater(49 // (k - 1) + 1, budget, (put, k))  # the smallest such K

    def test_env(self):
        self.assertIsNone(_memory.snap_every_env(""))
        self.assertEqual(_memory.snap_every_env("5"), 5)
        for bad in ("0", "-1", "2x", " 3", "1.5", "9" * 12):
            with self.assertRaises(ValueError, msg=bad):
                _memory.snap_every_env(bad)


class Memory(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)
        cls.store = rktest.tempfile.mkdtemp(prefix="rkpy-store.")
        dist.init_process_group("gloo", init_method=f"file://{cls.store}/s", rank=0, world_size=1)
        _, _, cls.ref = train(STEPS, {})

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()
        rktest.shutil.rmtree(cls.store, True)

    def setUp(self):
        for k in ("RK_HEARTBEAT", "RK_CKPT_DIR", "RK_RESUME", "RK_INJECT", "RK_INJECT_DONE", "RK_STACK_DIR",
                  "RK_SNAP_DIR", "RK_SNAP_EVERY"):
            os.environ.pop(k, None)
        self.ck = rktest.tmpdir(self)
        self.sd = snap.make_dir(rktest.tmpdir(self))
        self.env = {"RK_CKPT_DIR": self.ck, "RK_SNAP_DIR": self.sd, "RK_SNAP_EVERY": "1"}

    def crashed_at(self, step, **env):
        """A run 'killed' at `step` (checkpoints on disk every 15 steps): the snapshots it left."""
        job, ev, _ = train(STEPS, dict(self.env, **env), stop_at=step, ckpt_every=15)
        self.assertEqual([e for e in ev if e[1] == "snapshot_off"], [])
        return snap.steps(self.sd, 0)

    def resume(self):
        job, ev, h = train(STEPS, dict(self.env, RK_RESUME="1"), ckpt_every=15)
        return job, h

    def test_resume_from_memory_is_exact(self):
        self.assertEqual(self.crashed_at(37), [37, 36], "a put every step, two generations kept")
        self.assertEqual([s for s, _ in ckpt.list_checkpoints(self.ck)], [30, 15])
        job, h = self.resume()
        self.assertEqual((job.restored_from, job.start_step), ("memory", 37))
        self.assertEqual(h, self.ref, "resumed from memory at 37: the uninterrupted run's weights")

    def test_every_k_steps(self):
        self.assertEqual(self.crashed_at(37, RK_SNAP_EVERY="5"), [35, 30])
        job, h = self.resume()
        self.assertEqual((job.restored_from, job.start_step), ("memory", 35))
        self.assertEqual(h, self.ref)

    def test_timed_k_is_at_most_the_disk_interval(self):
        env = dict(self.env)
        del env["RK_SNAP_EVERY"]
        job, _, _ = train(40, env, stop_at=30, ckpt_every=15)
        self.assertTrue(1 <= job._mem_every <= 15, job._mem_every)
        self.assertGreaterEqual(job._mem_timed, 4, "the first put and three timed ones")

    def test_k_is_timed_again_as_the_steps_settle(self):
        """K is chosen at the 4th put (three timed) and again at the 16th, 64th and 256th, each
        from the puts and steps since the choice before: the median step of many, not the
        fastest of the first few (a profiled run of the example timed 20.6 ms steps that settled
        at 11.6 ms: K 8 where the rule wanted 13); then no more."""
        env = dict(self.env)
        del env["RK_SNAP_EVERY"]
        calls = []

        def rule(put, step, cap, forced=0):
            seen = sorted(sys._getframe(1).f_locals["self"]._mem_steps)  # the Job's, since the last choice
            n = len(seen)
            calls.append((put, step, cap, forced, n, seen[0] if n < 8 else (seen[n // 2 - 1] + seen[n // 2]) / 2))
            return 1

        with mock.patch.object(_memory, "snap_every", rule):
            job, _, _ = train(300, env, ckpt_every=50)
        self.assertEqual(len(calls), 4, calls)  # at puts 4, 16, 64, 256
        self.assertEqual(job._mem_timed, 256)
        self.assertTrue(all(c[0] > 0 and c[1] > 0 and c[2:4] == (50, 50) for c in calls), calls)
        # the steps before the timed puts since the last choice: 3 (the fastest), then 12, 48
        # and 192 (their median)
        self.assertEqual([c[4] for c in calls], [3, 12, 48, 192])
        self.assertEqual([c[1] for c in calls], [c[5] for c in calls])
        self.assertEqual((job._mem_puts, job._mem_steps), ([], []))

    def test_rollback_puts_the_step_again(self):
        """Three NaN trips at step 12 roll back to the verified step 10: step 10 is put again
        (which deletes the abandoned 11 and 12), and a resume is exact."""
        real, calls = snap.put, []

        def put(*a, **kw):
            calls.append(a[2])
            return real(*a, **kw)

        with mock.patch.object(snap, "put", put):
            _, ev, _ = train(STEPS, self.env, stop_at=37, ckpt_every=15, nan=(12, 3))
        self.assertEqual([e[2]["action"] for e in ev if e[1] == "guard_rollback"], ["rollback"], ev)
        self.assertEqual(calls[:16], list(range(13)) + [10, 11, 12], "12, then 10 again after the rollback")
        self.assertEqual(snap.steps(self.sd, 0), [37, 36])
        job, h = self.resume()
        self.assertEqual((job.restored_from, job.start_step, h), ("memory", 37, self.ref))

    def test_disk_checkpoints_steps_are_put(self):
        """Memory is never older than the disk: K = 11 from step 0 puts 0 and 11; the disk
        checkpoint of 15 is put too (the next K steps after it: 26), then 30, 41, 45; so a
        crash at 46 resumes from memory at 45 (a rank replaced in place needs memory)."""
        self.assertEqual(self.crashed_at(46, RK_SNAP_EVERY="11"), [45, 41])
        job, h = self.resume()
        self.assertEqual((job.restored_from, job.start_step), ("memory", 45))
        self.assertEqual(h, self.ref)

    def test_disk_wins_when_newer(self):
        # as above, with memory's 45 lost: 41 in memory, 45 on disk
        self.assertEqual(self.crashed_at(46, RK_SNAP_EVERY="11"), [45, 41])
        os.unlink(os.path.join(self.sd, "rank-0", snap.file_name(45)))
        job, h = self.resume()
        self.assertEqual((job.restored_from, job.start_step), ("disk", 45), "41 in memory, 45 on disk")
        self.assertEqual(h, self.ref)

    def test_torn_copy_is_never_restored(self):
        """A rank SIGKILLed in the middle of its copy of step 38 (a real kill, mid-write): the
        generation of 37 is restored, the torn file never."""
        self.assertEqual(self.crashed_at(37), [37, 36])
        child = subprocess.run([sys.executable, "-c", """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from rekindle import snap
c = snap.get(sys.argv[2], 0, 37)
real = os.write
def write(fd, b):
    real(fd, bytes(memoryview(b).cast("B")[: max(1, len(b) // 2)]))
    os.kill(os.getpid(), signal.SIGKILL)
os.write = write
snap.put(sys.argv[2], 0, 38, list(c.items.values()), epoch=c.epoch, cursor=c.cursor,
         world_size=c.world_size, config=c.config)
""", PY, self.sd], capture_output=True, timeout=120)
        self.assertEqual(child.returncode, -signal.SIGKILL, child.stderr.decode()[-400:])
        names = os.listdir(os.path.join(self.sd, "rank-0"))
        torn = [n for n in names if n.startswith(snap.file_name(38) + ".tmp.")]
        self.assertEqual(len(torn), 1, f"the torn copy is there: {names}")
        self.assertEqual(snap.steps(self.sd, 0), [37], "the put's retention ran; 38 is no generation")
        job, h = self.resume()
        self.assertEqual((job.restored_from, job.start_step), ("memory", 37))
        self.assertEqual(h, self.ref)

    def flip(self, step):
        with open(os.path.join(self.sd, "rank-0", snap.file_name(step)), "r+b") as f:
            f.seek(-5, os.SEEK_END)
            b = f.read(1)
            f.seek(-5, os.SEEK_END)
            f.write(bytes([b[0] ^ 0x10]))

    def test_a_first_launch_says_nothing_of_memory(self):
        """An empty snapshot directory (a first launch) is no lack of a common step: the resume
        says nothing of memory; one whose generations all fail says it resumes from disk."""
        said = []
        with mock.patch.object(rkt.Job, "_say", lambda job, msg: said.append(msg)):
            train(STEPS, dict(self.env, RK_RESUME="1"), stop_at=20, ckpt_every=15)
        self.assertEqual([m for m in said if "snapshot:" in m and "resuming from disk" in m], [], said)

    def test_checksum_failure_is_never_restored(self):
        self.assertEqual(self.crashed_at(37), [37, 36])
        self.flip(37)
        job, h = self.resume()
        self.assertEqual((job.restored_from, job.start_step), ("memory", 36), "37 fails its checksum: 36")
        self.assertEqual(h, self.ref)

    def test_every_generation_bad_resumes_from_disk(self):
        self.assertEqual(self.crashed_at(37), [37, 36])
        self.flip(37)
        self.flip(36)
        job, h = self.resume()
        self.assertEqual((job.restored_from, job.start_step), ("disk", 30))
        self.assertEqual(h, self.ref)

    def test_no_room_is_one_event_and_disk_only(self):
        with mock.patch.object(snap, "room", return_value=(False, "1.0 MiB short")):
            job, ev, h = train(STEPS, self.env, ckpt_every=15)
        off = [e for e in ev if e[1] == "snapshot_off"]
        self.assertEqual(len(off), 1, ev)
        self.assertEqual((off[0][2]["blame"], off[0][2]["action"], off[0][2]["detail"]),
                         (-1, "disk_only", "1.0 MiB short"))
        self.assertEqual(snap.steps(self.sd, 0), [], "nothing put")
        self.assertFalse(job._mem_put_ok, "off for the rest of the job")
        self.assertEqual(h, self.ref)

    def test_failing_put_is_one_event_and_disk_only(self):
        real, calls = snap.put, []

        def put(*a, **kw):
            calls.append(a[2])
            if len(calls) == 3:
                raise ckpt.StorageError(errno.ENOSPC, f"{self.sd}/rank-0: cannot write the snapshot")
            return real(*a, **kw)

        with mock.patch.object(snap, "put", put):
            job, ev, h = train(STEPS, self.env, ckpt_every=15)
        off = [e for e in ev if e[1] == "snapshot_off"]
        self.assertEqual(len(off), 1, ev)
        self.assertEqual((off[0][0], off[0][2]["blame"], off[0][2]["action"]), (2, -1, "disk_only"))
        self.assertIn("could not put its snapshot of step 2", off[0][2]["detail"])
        self.assertEqual(calls, [0, 1, 2], "no put after the failed one")
        self.assertEqual(h, self.ref)

    def test_without_snap_dir_nothing_changes(self):
        env = dict(self.env)
        del env["RK_SNAP_DIR"]
        job, ev, h = train(30, env, stop_at=20, ckpt_every=15)
        self.assertIsNone(job._mem_dir)
        self.assertEqual(snap.steps(self.sd, 0), [])
        job, _, h = train(STEPS, dict(env, RK_RESUME="1"), ckpt_every=15)
        self.assertEqual((job.restored_from, job.start_step, h), ("disk", 15, self.ref))



class TestRngPack(unittest.TestCase):
    def test_numpy_and_python_states_survive_the_slot_bytes(self):
        import random

        from rekindle.torch import _inplace
        for gauss in (False, True):  # Python's gauss_next None, and a float
            np.random.seed(11)
            random.seed(12)
            np.random.normal()  # numpy's cached gaussian
            if gauss:
                random.gauss(0, 1)
            n, r = np.random.get_state(), random.getstate()
            b = _inplace._py_rng_pack(n, r)
            self.assertEqual(len(b), 5025)
            n2, r2 = _inplace._py_rng_unpack(b)
            self.assertEqual(r2, r)
            self.assertEqual((n2[0], *n2[2:]), (n[0], *n[2:]))
            self.assertTrue(np.array_equal(n2[1], n[1]))
            np.random.set_state(n2)  # what the replacement does: the next draws are the same
            random.setstate(r2)
            a = (np.random.normal(), random.gauss(0, 1))
            np.random.set_state(n)
            random.setstate(r)
            self.assertEqual(a, (np.random.normal(), random.gauss(0, 1)))


class TestVoidRendezvous(unittest.TestCase):
    """A survivor joining a rendezvous that rk run has made void (a newer rejoin command: a
    failure during the recovery) is not left waiting for a rank that will never come."""

    class _W:  # the Worker's side _Watch reads: alive() and the newest rejoin command
        def __init__(self):
            self.rejoin = {"epoch": 1, "port": 1}

        def alive(self):
            return True

    def _store(self):
        import datetime
        import socket as so
        with so.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return port, dist.TCPStore("127.0.0.1", port, 2, True, datetime.timedelta(seconds=60),
                                   wait_for_workers=False, multi_tenant=True)

    def test_a_newer_rejoin_ends_a_store_wait_at_once(self):
        import threading
        import time

        from rekindle.torch import _inplace
        port, store = self._store()
        w = self._W()
        watch = _inplace._Watch(w, 1, port)
        try:
            threading.Timer(0.3, lambda: w.__setattr__("rejoin", {"epoch": 2, "port": 2})).start()
            t0 = time.monotonic()
            with self.assertRaises(RuntimeError):  # the key a dead rank would have set: 60 s
                store.wait(["rank_2_address"])
            took = time.monotonic() - t0
            self.assertTrue(watch.void())
            self.assertLess(took, 30.0, "the wait lasted the store's timeout")
        finally:
            watch.close()
        self.assertFalse(watch._t.is_alive())

    def test_no_newer_rejoin_touches_nothing(self):
        from rekindle.torch import _inplace
        port, store = self._store()
        watch = _inplace._Watch(self._W(), 1, port)
        store.set("k", b"v")
        for _ in range(20):  # the watch runs every 5 ms: it leaves the store's connection open
            self.assertEqual(store.get("k"), b"v")
            watch._done.wait(0.01)
        watch.close()
        self.assertFalse(watch.void())
        self.assertEqual(_inplace._shut_store(port + 1 if port < 65535 else port - 1), 0)

    def test_await_store_gives_up_on_a_void_rendezvous(self):
        import socket as so

        from rekindle.torch import _inplace
        with so.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # nothing listens there
        with self.assertRaisesRegex(_inplace._Void, "is void"):
            _inplace.await_store("127.0.0.1", port, wait_s=30, void=lambda: True)


if __name__ == "__main__":
    unittest.main()
