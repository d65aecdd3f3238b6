"""rekindle.torch as a ported script uses it: batches from Job.loader (a DataLoader) under
Dropout, Adam and an LR scheduler resume exactly after a crash and leave no trace of a redo
or a rollback; a split of the global batch that does not add up and the script's own exception
exit with the events that say so; gradient accumulation with job.steps. Skips without torch."""

import os
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
ENV = ("RK_HEARTBEAT", "RK_CKPT_DIR", "RK_RESUME", "RK_INJECT", "RK_INJECT_DONE", "RK_STACK_DIR")


def train(steps, env=None, nan_at=None, nan_times=0, **kw):
    """A small MLP with Dropout, Adam and a StepLR, its batches from job.loader; returns
    (job, events, params hash, lr)."""
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        torch.manual_seed(3)
        np.random.seed(3)
        g = torch.Generator().manual_seed(7)
        x = torch.randn(N, 12, generator=g)
        y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
        ds = torch.utils.data.TensorDataset(x, y)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Dropout(0.3), torch.nn.Tanh(),
                                        torch.nn.Linear(16, 2)))
        opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.9, 0.99))
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
        job = rkt.Job(model, opt, global_batch=BATCH, data_size=N, name="mlp", verbose=False,
                      scheduler=sched, **kw)
        events = []
        job.w.event = lambda step, kind, **k: events.append((step, kind, k.get("action")))
        batches = job.loader(ds, seed=1)
        for step in job.steps(steps):
            xb, yb = next(batches)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            if step == nan_at and nan_times > 0:
                nan_times -= 1
                loss = loss * float("nan")
            job.scale(loss, len(yb)).backward()
            job.step()
            sched.step()  # the loop steps it; the Job saves it and puts it back on a redo
        return job, events, rkt.params_hash(model.module), opt.param_groups[0]["lr"]
    finally:
        os.environ.clear()
        os.environ.update(old)


class Port(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)
        cls.store = rktest.tempfile.mkdtemp(prefix="rkpy-store.")
        dist.init_process_group("gloo", init_method=f"file://{cls.store}/s", rank=0, world_size=1)
        cls.ref = train(40)

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()
        rktest.shutil.rmtree(cls.store, True)

    def setUp(self):
        for k in ENV:
            os.environ.pop(k, None)

    def test_batch_indices_split(self):
        for world in (1, 2, 3, 5):
            parts = [rkt.batch_indices(9, N, BATCH, 1, r, world) for r in range(world)]
            self.assertEqual(sum(len(p) for p in parts), BATCH)
            self.assertEqual(torch.cat(parts).tolist(), rkt.batch_indices(9, N, BATCH, 1).tolist())

    def test_resume_after_crash_is_exact(self):
        _, _, ref, lr = self.ref
        d = rktest.tmpdir(self)
        train(25, env={"RK_CKPT_DIR": d}, ckpt_every=10)
        os.unlink(os.path.join(d, ckpt.file_name(25)))  # the crash at 25: the newest is step 20's
        job, _, got, got_lr = train(40, env={"RK_CKPT_DIR": d, "RK_RESUME": "1"}, ckpt_every=10)
        self.assertEqual(job.start_step, 20)
        self.assertEqual(got, ref, "resumed at 20 from a DataLoader port: the uninterrupted run's weights")
        self.assertEqual(got_lr, lr)
        self.assertEqual(job.scheduler.last_epoch, 40)
        self.assertIs(type(job.opt.param_groups[0]["betas"]), tuple)
        p = job.opt.param_groups[0]["params"][0]
        self.assertEqual(list(job.opt.state[p]), ["step", "exp_avg", "exp_avg_sq"])

    def test_nan_redo_and_rollback_leave_no_trace(self):
        _, _, ref, lr = self.ref
        _, ev, got, got_lr = train(40, env={"RK_INJECT": "nan@step=12"})
        self.assertEqual(ev, [(12, "nan", "redo")])
        self.assertEqual((got, got_lr), (ref, lr), "a redone step: the scheduler stepped once")
        _, ev, got, got_lr = train(40, nan_at=16, nan_times=3)
        self.assertEqual(ev[-1], (16, "guard_rollback", "rollback"))
        self.assertEqual((got, got_lr), (ref, lr), "rolled back and replayed: the scheduler's state too")


SCRIPT = r"""
import sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import rekindle.torch as rkt
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
mode = sys.argv[2]
model = DDP(torch.nn.Linear(3, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
job = rkt.Job(model, opt, global_batch=4)
job.w.exit_event = lambda step, kind, detail="", blame=-1: print("EXIT_EVENT", step, kind, detail, flush=True)
for step in job.steps(5):
    opt.zero_grad()
    n = 3 if mode == "short" else 4
    if mode == "accum":
        for _ in range(2):
            job.scale(model(torch.ones(2, 3)).pow(2).mean(), 2).backward()
    else:
        job.scale(model(torch.ones(n, 3)).pow(2).mean(), n).backward()
    if step == 2 and mode == "raise":
        {}["no such key"]
    if step == 2 and mode == "scaler":
        gs = torch.cuda.amp.GradScaler(enabled=False)
        gs.scale(torch.ones(()))  # disabled (as on a CPU): passes
        gs._enabled = True  # as with CUDA
        gs.scale(torch.ones(()))
    if step == 2 and mode == "cuda":
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    job.step()
print("loop ended")
"""


class Exits(unittest.TestCase):
    def run_script(self, mode):
        d = rktest.tmpdir(self)
        env = rktest.env_with_pythonpath()
        for k in ENV:
            env.pop(k, None)
        return subprocess.run([sys.executable, "-c", SCRIPT, os.path.join(d, "store"), mode],
                              env=env, capture_output=True, text=True, timeout=60)

    def test_shares_not_summing_to_global_batch(self):
        p = self.run_script("short")
        self.assertEqual(p.returncode, 2, p.stderr[-2000:])
        self.assertIn("EXIT_EVENT 0 usage ranks' samples sum to 3, global_batch is 4: split the global batch "
                      "over the ranks (rekindle.torch.batch_indices)", p.stdout)
        self.assertNotIn("loop ended", p.stdout)

    def test_gradient_accumulation(self):
        # two micro-batches of 2 a step (job.scale twice): the step is judged once, with 4 samples
        p = self.run_script("accum")
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        self.assertIn("loop ended", p.stdout)
        self.assertIn("global batch 4 samples over 1 rank (this rank 4; global_batch 4)", p.stderr)

    def test_exception_is_no_device_fault(self):
        p = self.run_script("raise")
        self.assertEqual(p.returncode, 1, p.stderr[-2000:])
        self.assertIn("EXIT_EVENT 2 exception KeyError: 'no such key' (<string>:", p.stdout)
        self.assertIn("Traceback (most recent call last)", p.stderr)

    def test_grad_scaler_refused(self):
        p = self.run_script("scaler")
        self.assertEqual(p.returncode, 2, p.stderr[-2000:])
        self.assertIn("EXIT_EVENT 2 usage torch.cuda.amp.GradScaler is not supported yet", p.stdout)

    def test_device_error_stays_a_crash(self):
        p = self.run_script("cuda")
        self.assertEqual(p.returncode, 1, p.stderr[-2000:])
        self.assertNotIn("EXIT_EVENT", p.stdout)
        self.assertIn("CUDA error", p.stderr)


if __name__ == "__main__":
    unittest.main()
