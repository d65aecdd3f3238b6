"""rekindle.torch in one process (a gloo group of one): the guards' arithmetic, a resume that
is exact, the checkpoint's names, a NaN redone and a loss spike kept. Skips without torch."""

import math
import os
import struct
import subprocess
import sys
import unittest

import rktest  # noqa: F401  (python/ first on sys.path)

try:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import rekindle.torch as rkt
    from rekindle import ckpt
except ImportError as e:  # pragma: no cover
    raise unittest.SkipTest(f"SKIP: torch, numpy or xxhash missing ({e})")

N, BATCH = 256, 32


def data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N, 12, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return x, y


class _SumFault:
    """A process group whose all-reduce result gets an infinity at step `at` (once): a sum
    that is not finite where the rank's own gradient was."""

    def __init__(self, job, at):
        self.pg, self.job, self.at = job._pg, job, at

    def allreduce(self, tensors, opts):
        work = self.pg.allreduce(tensors, opts)
        if self.job.step_no == self.at:
            self.at = None
            work.wait()
            tensors[0][0] = float("inf")
        return work


def train(steps, env=None, spike_at=None, nan_at=None, nan_times=0, bn=False, sumfault_at=None, jitter=False,
          **kw):
    """Train a small MLP for `steps` under a Job; returns (job, events, params hash)."""
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        torch.manual_seed(3)
        np.random.seed(3)
        norm = [torch.nn.BatchNorm1d(16)] if bn else []  # buffers the forward updates
        model = DDP(torch.nn.Sequential(torch.nn.Linear(12, 16), *norm, torch.nn.Tanh(), torch.nn.Linear(16, 2)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x, y = data()
        job = rkt.Job(model, opt, global_batch=BATCH, data_size=N, name="mlp", verbose=False, **kw)
        events = []
        job.w.event = lambda step, kind, **k: events.append((step, kind, k.get("blame"), k.get("action")))
        if sumfault_at is not None:
            job._pg = _SumFault(job, sumfault_at)
        tries = {}
        for step in job.steps(steps):
            tries[step] = tries.get(step, 0) + 1
            if tries[step] > 6:
                raise AssertionError(f"step {step} attempted {tries[step]} times")
            per = N // BATCH
            idx = torch.from_numpy(np.random.default_rng([1, step // per]).permutation(N)[
                (step % per) * BATCH:(step % per + 1) * BATCH])
            yb = 1 - y[idx] if step == spike_at else y[idx]  # every label wrong: a spike of the data
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), yb)
            if jitter and step == spike_at:  # a forward that is not bit for bit the same each time
                loss = loss * (1 + 1e-6 * tries[step])
            if step == nan_at and nan_times > 0:  # a fault that outlasts the redos
                nan_times -= 1
                loss = loss * float("nan")
            loss = job.scale(loss, len(idx))
            loss.backward()
            job.step()
        return job, events, rkt.params_hash(model.module)
    finally:
        os.environ.clear()
        os.environ.update(old)


class GuardMath(unittest.TestCase):
    def test_outliers(self):
        self.assertEqual(rkt.grad_outliers([1.0, 1.2, 0.9, 2000.0], 1000), [3])
        self.assertEqual(rkt.grad_outliers([1.0, 1.2, 0.9, 900.0], 1000), [])
        self.assertEqual(rkt.grad_outliers([1.0, 1001.0], 1000), [1])
        self.assertEqual(rkt.grad_outliers([1001.0, 1.0], 1000), [0])
        self.assertEqual(rkt.grad_outliers([1.0, 999.0], 1000), [])
        self.assertEqual(rkt.grad_outliers([5.0], 1000), [])

    def test_zscore(self):
        w = [1.0 + 0.01 * (i % 5) for i in range(32)]
        self.assertLess(rkt.spike_zscore(w, 1.03), 3)
        self.assertGreater(rkt.spike_zscore(w, 2.0), 10)
        self.assertEqual(rkt.spike_zscore([0.0] * 32, 1.0), 0.0)
        # the MAD is floored at 1% of the median: a flat window does not make every loss a spike
        self.assertLess(rkt.spike_zscore([1.0] * 32, 1.05), 10)

    def test_hook_sums_large_finite_gradients(self):
        """The hook's float32 shortcuts fall back where float32 overflows: a large but finite
        gradient is not taken for an infinite one, an infinite one is still seen."""
        from rekindle.torch import _hook

        class J:
            _sumsq = None
            _red_bad = False
            _redsums = []

        j = J()
        _hook._add_sumsq(j, torch.full((64,), 1e20), True)
        self.assertTrue(math.isfinite(j._sumsq) and abs(j._sumsq / 6.4e41 - 1) < 1e-6, j._sumsq)
        _hook._add_sumsq(j, torch.full((8,), 2.0, dtype=torch.float64), True)
        self.assertAlmostEqual(j._sumsq / 6.4e41, 1.0)
        big = torch.full((64,), 3e38)  # finite elements whose float32 sum overflows
        _hook._add_redsum(j, big, True)
        self.assertFalse(j._red_bad, "a finite reduced bucket is not 'not finite'")
        big[5] = float("inf")
        _hook._add_redsum(j, big, True)
        self.assertTrue(j._red_bad)
        j2 = J()
        j2._red_bad = False
        _hook._add_redsum(j2, torch.tensor([1.0, float("nan")]), True)
        self.assertTrue(j2._red_bad)


class OneRank(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)
        cls.store = rktest.tempfile.mkdtemp(prefix="rkpy-store.")
        dist.init_process_group("gloo", init_method=f"file://{cls.store}/s", rank=0, world_size=1)

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()
        rktest.shutil.rmtree(cls.store, True)

    def setUp(self):
        for k in ("RK_HEARTBEAT", "RK_CKPT_DIR", "RK_RESUME", "RK_INJECT", "RK_INJECT_DONE", "RK_STACK_DIR"):
            os.environ.pop(k, None)

    def test_the_model_does_not_keep_the_job(self):
        # DDP's reducer holds the comm hook's state: a Job held there strongly was a cycle
        # through C++ (model -> reducer -> Job -> model) that no gc could free, left to the
        # interpreter's finalization with gloo's threads running
        import gc
        import weakref

        torch.manual_seed(3)
        model = DDP(torch.nn.Linear(12, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        job = rkt.Job(model, opt, global_batch=4, verbose=False)
        for _ in job.steps(2):
            opt.zero_grad()
            job.scale(model(torch.randn(4, 12)).sum(), 4).backward()
            job.step()
        gone = weakref.ref(job)
        del job
        gc.collect()
        self.assertIsNone(gone(), "the Job outlives its last reference")
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        model(torch.randn(4, 12)).sum().backward()  # the hook without its Job: plain averaging
        opt.step()
        self.assertTrue(any(not torch.equal(a, b) for a, b in zip(before, model.parameters())))

    def test_resume_is_exact(self):
        _, _, ref = train(60)
        d = rktest.tmpdir(self)
        job, _, h40 = train(40, env={"RK_CKPT_DIR": d}, ckpt_every=15)
        self.assertEqual(job.step_no, 40)
        steps = sorted(ckpt.name_step(n) for n in os.listdir(d) if ckpt.name_step(n) is not None)
        self.assertEqual(steps, [15, 30, 40])
        job, _, got = train(60, env={"RK_CKPT_DIR": d, "RK_RESUME": "1"}, ckpt_every=15)
        self.assertEqual(job.start_step, 40)
        self.assertEqual(got, ref, "resumed at 40, trained to 60: the uninterrupted run's weights")

    def test_checkpoint_names(self):
        d = rktest.tmpdir(self)
        train(10, env={"RK_CKPT_DIR": d}, ckpt_every=0)
        c = ckpt.load(os.path.join(d, ckpt.file_name(10)))
        names = list(c.items)
        self.assertEqual([n for n in names if n.startswith("model.")],
                         ["model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias"])
        self.assertIn("optim.0.weight.momentum_buffer", names)
        self.assertIn("optim.param_groups", names)
        for n in ("rng.torch", "rng.numpy", "rng.random", "data.epoch", "data.cursor", "guard.losses"):
            self.assertIn(n, names)
        self.assertEqual((c.step, c.epoch, c.cursor), (10, 1, 2 * BATCH))
        self.assertEqual(struct.unpack("<q", bytes(c.items["data.cursor"].data))[0], 2 * BATCH)

    def test_nan_is_redone(self):
        _, _, ref = train(30)
        job, ev, got = train(30, env={"RK_INJECT": "nan@step=12"})
        self.assertEqual(ev, [(12, "nan", 0, "redo")])
        self.assertEqual(got, ref, "a redone NaN step leaves no trace")

    def test_nan_redo_restores_buffers(self):
        _, _, ref = train(30, bn=True)
        _, ev, got = train(30, env={"RK_INJECT": "nan@step=12"}, bn=True)
        self.assertEqual(ev, [(12, "nan", 0, "redo")])
        self.assertEqual(got, ref, "BatchNorm's running statistics are those of one forward of step 12")

    def test_non_finite_sum_is_redone(self):
        _, _, ref = train(30)
        _, ev, got = train(30, sumfault_at=12)
        self.assertEqual(ev, [(12, "nan", -1, "redo")])
        self.assertEqual(got, ref, "a sum that is not finite is not applied")

    def test_nan_without_guard_is_applied(self):
        _, ev, _ = train(14, env={"RK_INJECT": "nan@step=12"}, guard=False)
        self.assertEqual(ev, [])

    def test_three_trips_roll_back(self):
        _, _, ref = train(30)
        _, ev, got = train(30, nan_at=14, nan_times=3)
        self.assertEqual([(s, k, a) for s, k, _, a in ev],
                         [(14, "nan", "redo")] * 3 + [(14, "guard_rollback", "rollback")])
        self.assertEqual(got, ref, "three trips at one step: back to step 10, replayed, the same weights")

    def test_spike_kept(self):
        _, ev, _ = train(50, spike_at=40)
        kinds = [(s, k) for s, k, _, _ in ev]
        self.assertEqual(kinds, [(40, "loss_spike"), (40, "spike_kept")])

    def test_spike_redone_once_when_the_loss_differs(self):
        # a spike that is the data, on a forward that rounds differently each time (a GPU):
        # one redo, then it is kept (it used to be redone for as long as its bits differed)
        _, ev, _ = train(50, spike_at=40, jitter=True)
        kinds = [(s, k) for s, k, _, _ in ev]
        self.assertEqual(kinds, [(40, "loss_spike"), (40, "spike_kept")])


STORAGE = r"""
import errno, os, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import rekindle.torch as rkt
from rekindle import ckpt
def full(*a, **k):
    raise ckpt.StorageError(errno.ENOSPC, "no space left on the device (simulated)", sys.argv[2])
ckpt.save = full
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
model = DDP(torch.nn.Linear(3, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
job = rkt.Job(model, opt, global_batch=4, ckpt_dir=sys.argv[2], ckpt_every=2)
events = []
job.w.exit_event = lambda step, kind, detail="", blame=-1: print("EXIT_EVENT", step, kind, flush=True)
for step in job.steps(5):
    opt.zero_grad()
    job.scale(model(torch.ones(4, 3)).pow(2).mean(), 4).backward()
    job.step()
print("not reached")
"""


class Storage(unittest.TestCase):
    def test_storage_error_is_exit_6(self):
        d = rktest.tmpdir(self)
        env = rktest.env_with_pythonpath()
        for k in ("RK_HEARTBEAT", "RK_CKPT_DIR", "RK_RESUME", "RK_INJECT", "RK_STACK_DIR"):
            env.pop(k, None)
        p = subprocess.run([sys.executable, "-c", STORAGE, os.path.join(d, "store"), os.path.join(d, "ck")],
                           env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 6, p.stderr[-2000:])
        self.assertIn("EXIT_EVENT 2 storage", p.stdout)
        self.assertNotIn("not reached", p.stdout)
        self.assertIn("no space left", p.stderr)


MISMATCH = r"""
import os, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import rekindle.torch as rkt
store, ck, name, size, batch, groups = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)))
ps = list(model.parameters())
opt = torch.optim.SGD([{"params": ps[:2]}, {"params": ps[2:]}] if groups == 2 else ps, lr=0.1)
import rekindle
rekindle.Worker.exit_event = lambda self, step, kind, detail="", blame=-1: print("EXIT_EVENT", step, kind, detail, flush=True)
job = rkt.Job(model, opt, global_batch=batch, data_size=size, name=name, ckpt_dir=ck, resume=True, verbose=True)
for step in job.steps(2):
    opt.zero_grad()
    job.scale(model(torch.ones(batch, 3)).pow(2).mean(), batch).backward()
    job.step()
print("done", job.start_step, flush=True)
"""


class Resume(unittest.TestCase):
    def test_another_runs_checkpoint_is_exit_2(self):
        d = rktest.tmpdir(self)
        env = rktest.env_with_pythonpath()
        for k in ("RK_HEARTBEAT", "RK_CKPT_DIR", "RK_RESUME", "RK_INJECT", "RK_STACK_DIR"):
            env.pop(k, None)

        def run(i, name="mlp", size=64, batch=4, groups=1):
            return subprocess.run([sys.executable, "-c", MISMATCH, os.path.join(d, f"store{i}"), os.path.join(d, "ck"),
                                   name, str(size), str(batch), str(groups)],
                                  env=env, capture_output=True, text=True, timeout=60)

        p = run(0)
        self.assertEqual((p.returncode, p.stdout), (0, "done 0\n"), p.stderr[-2000:])
        p = run(1)  # the same run resumes (2 steps done already)
        self.assertEqual((p.returncode, p.stdout), (0, "done 2\n"), p.stderr[-2000:])
        for i, (kw, what) in enumerate([({"name": "other"}, "config 'model'"),
                                        ({"batch": 8}, "global batch 4, this run's 8: a resumed run keeps its "
                                                       "global batch"),
                                        ({"size": 128}, "data size 64, this run's is 128"),
                                        ({"groups": 2}, "1 parameter groups, this run's optimiser has 2")]):
            p = run(2 + i, **kw)
            self.assertEqual(p.returncode, 2, (kw, p.stdout, p.stderr[-2000:]))
            self.assertIn("EXIT_EVENT 0 usage cannot resume from another run's checkpoint", p.stdout)
            self.assertIn(what, p.stdout)
            self.assertNotIn("done", p.stdout)


if __name__ == "__main__":
    unittest.main()
