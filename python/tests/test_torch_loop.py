"""rekindle.torch around a training loop as people write it: an epoch loop over a DataLoader
with a DistributedSampler (set_epoch), workers and persistent workers, gradient accumulation
with no_sync, an LR scheduler stepped in the loop, dropout and a causal mask buffer of -inf.
The ported loop ends with the plain loop's bits, through a NaN redo, a rollback and resumes
mid-epoch and at an epoch's start; and the patterns that would train the wrong thing without
a word (issue 31's traps) exit 2 naming the pattern and the fix, or are now exact. Skips
without torch."""

import contextlib
import json
import os
import subprocess
import sys
import unittest

import rktest  # noqa: F401  (python/ first on sys.path)

try:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    import rekindle.torch as rkt
    from rekindle import ckpt
except ImportError as e:  # pragma: no cover
    raise unittest.SkipTest(f"SKIP: torch, numpy or xxhash missing ({e})")

N, BATCH, MICRO, BLOCK, VOCAB = 96, 16, 8, 6, 11  # 6 steps an epoch, 2 micro-batches a step
ENV = ("RK_HEARTBEAT", "RK_CKPT_DIR", "RK_RESUME", "RK_INJECT", "RK_INJECT_DONE", "RK_STACK_DIR")


class Tiny(torch.nn.Module):
    """Attention over the tokens with a causal mask buffer of -inf, and dropout."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 8)
        self.q = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.2)
        self.out = torch.nn.Linear(8, VOCAB)
        self.register_buffer("mask", torch.full((BLOCK, BLOCK), float("-inf")).triu(1))

    def forward(self, idx):
        x = self.emb(idx)
        att = (self.q(x) @ x.transpose(1, 2) + self.mask).softmax(-1)
        return self.out(self.drop(att @ x))


def train(epochs, port=True, env=None, workers=2, nan_at=None, nan_times=0, **kw):
    """The loop, plain (port=False) or ported; returns (job, events, params hash, lr)."""
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        torch.manual_seed(3)
        g = torch.Generator().manual_seed(7)
        x = torch.randint(VOCAB, (N, BLOCK + 1), generator=g)
        ds = TensorDataset(x[:, :-1], x[:, 1:])
        sampler = DistributedSampler(ds, shuffle=True, seed=1, drop_last=True)
        loader = DataLoader(ds, batch_size=MICRO, sampler=sampler, num_workers=workers, pin_memory=True,
                            persistent_workers=workers > 0, drop_last=True)
        model = DDP(Tiny())
        opt = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.1 * s))
        accum = BATCH // MICRO
        job, events = None, []
        if port:
            job = rkt.Job(model, opt, scheduler=sched, global_batch=BATCH, name="tiny", verbose=False, **kw)
            job.w.event = lambda step, kind, **k: events.append((step, kind, k.get("action")))
        for epoch in (job.epochs(epochs) if port else range(epochs)):
            sampler.set_epoch(epoch)
            for i, (xb, yb) in enumerate(job.batches(loader) if port else loader):
                last = (i + 1) % accum == 0
                with contextlib.nullcontext() if last else model.no_sync():
                    loss = torch.nn.functional.cross_entropy(model(xb).view(-1, VOCAB), yb.reshape(-1))
                    if port and job.step_no == nan_at and nan_times > 0 and last:
                        nan_times -= 1  # a fault that outlasts the redos: a rollback
                        loss = loss * float("nan")
                    (job.scale(loss, len(yb)) if port else loss / accum).backward()
                if last:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    job.step() if port else opt.step()
                    sched.step()
                    opt.zero_grad(set_to_none=True)
        return job, events, rkt.params_hash(model.module), opt.param_groups[0]["lr"]
    finally:
        os.environ.clear()
        os.environ.update(old)


class Loop(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        cls.store = rktest.tempfile.mkdtemp(prefix="rkpy-store.")
        dist.init_process_group("gloo", init_method=f"file://{cls.store}/s", rank=0, world_size=1)
        cls.ref = train(3, port=False)

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()
        rktest.shutil.rmtree(cls.store, True)

    def setUp(self):
        for k in ENV:
            os.environ.pop(k, None)

    def test_port_ends_with_the_plain_loops_bits(self):
        job, ev, got, lr = train(3)
        self.assertEqual((got, lr), self.ref[2:], "the ported loop: the plain loop's weights and learning rate")
        self.assertEqual((job.step_no, job.accum, job.epoch, job.cursor, ev), (18, 2, 3, 0, []))

    def test_redo_and_rollback_are_exact(self):
        _, ev, got, lr = train(3, env={"RK_INJECT": "nan@step=4,nan@step=6"})
        self.assertEqual(ev, [(4, "nan", "redo"), (6, "nan", "redo")])
        self.assertEqual((got, lr), self.ref[2:], "redone steps (one the first of an epoch): their micro-batches "
                         "again, the scheduler stepped once")
        _, ev, got, lr = train(3, nan_at=9, nan_times=3, hash_every=4)
        self.assertEqual(ev[-1], (9, "guard_rollback", "rollback"))
        self.assertEqual((got, lr), self.ref[2:], "rolled back to the epoch's first step and replayed")

    def test_resume_mid_epoch_and_at_an_epochs_start(self):
        for ckpt_every, crash_at, resumed in ((4, 10, 8), (6, 14, 12)):
            d = rktest.tmpdir(self)
            train(3, env={"RK_CKPT_DIR": d}, ckpt_every=ckpt_every, keep=10)
            for n in os.listdir(d):  # the crash: the checkpoints after it were never written
                if (ckpt.name_step(n) or 0) > crash_at:
                    os.unlink(os.path.join(d, n))
            with open(os.path.join(d, "latest"), "w") as f:
                f.write(ckpt.file_name(resumed) + "\n")
            job, _, got, lr = train(3, env={"RK_CKPT_DIR": d, "RK_RESUME": "1"}, ckpt_every=ckpt_every)
            self.assertEqual(job.start_step, resumed)
            self.assertEqual((got, lr), self.ref[2:], f"resumed at step {resumed}: the uninterrupted weights")
        c = ckpt.load(os.path.join(d, ckpt.file_name(12)))
        self.assertEqual((c.epoch, c.cursor), (2, 0))
        self.assertIn("buffer.mask", c.items)  # the mask of -inf, outside the finite rule of model.*
        self.assertNotIn("model.mask", c.items)
        self.assertEqual(int.from_bytes(bytes(c.items["data.accum"].data), "little"), 2)

    def test_without_workers_too(self):
        _, _, plain, _ = train(2, port=False, workers=0)
        _, _, got, _ = train(2, workers=0, env={"RK_INJECT": "nan@step=7"})
        self.assertEqual(got, plain)


# A one-process job in a subprocess (its exits are os._exit): argv store, mode, checkpoint dir.
SCRIPT = r"""
import contextlib, os, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
import rekindle, rekindle.torch as rkt
store, mode, ck = sys.argv[1], sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
rekindle.Worker.exit_event = lambda self, step, kind, detail="", blame=-1: print("EXIT_EVENT", step, kind, detail, flush=True)
torch.manual_seed(0)
x = torch.randn(64, 3)
y = x.sum(1, keepdim=True)
ds = TensorDataset(x, y)

class Masked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 1)
        self.register_buffer("mask", torch.tensor([0.0, float("-inf"), 0.0]))
    def forward(self, x):
        return self.lin(x * self.mask.exp())

model = DDP(Masked() if mode.startswith("mask") else torch.nn.Linear(3, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
steps = int(os.environ.get("STEPS", "6"))
job = rkt.Job(model, opt, global_batch=8, scheduler=sched if mode != "sched_not_given" else None,
              ckpt_dir=ck or None, resume=bool(ck) and mode.endswith("resume"), ckpt_every=2,
              guard=mode != "nan_params")

def fit(xb, yb, n):
    return job.scale(torch.nn.functional.mse_loss(model(xb), yb), n)

if mode in ("sched_not_given", "manual_lr", "mask", "mask_resume", "nan_params"):
    for step in job.steps(steps):
        idx = rkt.batch_indices(step, 64, 8, 1)
        if mode == "manual_lr":
            for g in opt.param_groups:
                g["lr"] = 0.05 / (1 + step)
        opt.zero_grad()
        fit(x[idx], y[idx], len(idx)).backward()
        job.step()
        if mode == "nan_params" and step == 2:
            with torch.no_grad():
                model.module.weight[0, 1] = float("nan")
        if mode != "manual_lr":
            sched.step()
elif mode == "loader_accum":  # two next() a step from job.loader: the same samples twice
    batches = job.loader(ds, seed=1)
    for step in job.steps(steps):
        (xa, ya), (xb, yb) = next(batches), next(batches)
        opt.zero_grad()
        fit(torch.cat([xa, xb])[:8], torch.cat([ya, yb])[:8], 8).backward()
        job.step()
elif mode == "loader_workers":  # StepBatches under a DataLoader with workers: read ahead
    batches = iter(DataLoader(ds, batch_sampler=rkt.StepBatches(job, 64, 1), num_workers=2,
                              generator=torch.Generator()))
    for step in job.steps(steps):
        xb, yb = next(batches)
        opt.zero_grad()
        fit(xb, yb, len(yb)).backward()
        job.step()
else:  # the epoch loop over job.batches
    bs, drop = {"partial": (6, False), "uneven": (4, True)}.get(mode, (4, True))
    loader = DataLoader(ds if mode != "uneven" else TensorDataset(x[:60], y[:60]), batch_size=bs,
                        drop_last=drop, shuffle=False)
    for epoch in (job.epochs(2) if mode != "no_epochs" else range(2)):
        for i, (xb, yb) in enumerate(job.batches(loader)):
            fit(xb, yb, len(yb)).backward()
            if (i + 1) % 2 == 0:
                job.step()
                opt.zero_grad()
print("done", job.step_no, rkt.params_hash(model.module), flush=True)
"""


class Exits(unittest.TestCase):
    def run_script(self, mode, ck="", steps=6):
        d = rktest.tmpdir(self)
        env = rktest.env_with_pythonpath({"STEPS": str(steps)})
        for k in ENV:
            env.pop(k, None)
        return subprocess.run([sys.executable, "-c", SCRIPT, os.path.join(d, "store"), mode, ck],
                              env=env, capture_output=True, text=True, timeout=600)

    def assertUsage(self, p, text):
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr[-2000:])
        self.assertIn(text, p.stdout)
        self.assertFalse([ln for ln in p.stdout.splitlines() if ln.startswith("done ")], p.stdout)

    def test_trap1_accumulation_over_job_loader_is_refused(self):
        # was: exit 0, each step trained on its batch twice
        self.assertUsage(self.run_script("loader_accum"), "EXIT_EVENT 0 usage StepBatches was asked for a second "
                         "batch in step 0: it serves one batch a step")

    def test_trap2_step_batches_under_workers_is_refused(self):
        # was: exit 0, the workers' read-ahead served step 0's batch at steps 0 to 4
        self.assertUsage(self.run_script("loader_workers"), "EXIT_EVENT 0 usage StepBatches was asked for a batch "
                         "outside a step: a DataLoader with workers")

    def test_trap3_a_scheduler_not_given_to_the_job_is_refused(self):
        # was: exit 0, and a resumed run trained with another learning rate
        self.assertUsage(self.run_script("sched_not_given"), "EXIT_EVENT 2 usage the learning rate of parameter "
                         "group 0 changed from 0.05 to 0.025 at step 2, stepped by a StepLR the Job was not "
                         "given")
        p = self.run_script("manual_lr")  # a learning rate the script sets itself: saved, put back, fine
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr[-2000:])
        self.assertIn("done 6", p.stdout)

    def test_trap4_a_mask_of_inf_is_saved_and_resumed(self):
        # was: every checkpoint refused as non-finite, exit 5 (guard_failed), blamed on the device
        ref = self.run_script("mask", steps=10)
        self.assertEqual(ref.returncode, 0, ref.stdout + ref.stderr[-2000:])
        ck = rktest.tmpdir(self)
        p = self.run_script("mask", ck, steps=6)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr[-2000:])
        c = ckpt.load(os.path.join(ck, ckpt.file_name(6)))
        self.assertEqual(c.items["buffer.mask"].dtype, "F32")
        self.assertNotIn("model.mask", c.items)
        p = self.run_script("mask_resume", ck, steps=10)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr[-2000:])
        self.assertEqual(p.stdout.split()[-1], ref.stdout.split()[-1], "resumed at 6: the uninterrupted weights")

    def test_nonfinite_parameters_refused_as_the_jobs_own(self):
        p = self.run_script("nan_params", rktest.tmpdir(self))
        self.assertEqual(p.returncode, 5, p.stdout + p.stderr[-2000:])
        self.assertIn("EXIT_EVENT 4 ckpt_refused checkpoint of step 4 refused: ", p.stdout)
        self.assertIn("'model.weight'", p.stdout)

    def test_epoch_loop_patterns_that_cannot_be_exact(self):
        self.assertUsage(self.run_script("partial"), "usage the DataLoader's last batch of an epoch holds 4 samples, "
                         "not batch_size 6: that step's samples would not sum to global_batch 8; pass drop_last=True")
        self.assertUsage(self.run_script("uneven"), "usage an epoch of the loader holds 15 micro-batches, not a "
                         "multiple of the 2 a step")
        self.assertUsage(self.run_script("no_epochs"), "usage job.batches(loader) is iterated outside job.epochs(n)")
        p = self.run_script("epochs")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr[-2000:])
        self.assertIn("done 16", p.stdout)


# 2 ranks, then 1, of a job whose global batch is computed from the world size (trap 6):
# argv rank, world, store, checkpoint dir.
WORLD = r"""
import sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import rekindle, rekindle.torch as rkt
rank, world, store, ck = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
rekindle.Worker.exit_event = lambda self, step, kind, detail="", blame=-1: print("EXIT_EVENT", step, kind, detail, flush=True)
model = DDP(torch.nn.Linear(3, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
micro = 8
job = rkt.Job(model, opt, global_batch=micro * world, ckpt_dir=ck, resume=True, ckpt_every=2)
for step in job.steps(4 if world == 2 else 6):
    opt.zero_grad()
    job.scale(model(torch.ones(micro, 3)).pow(2).mean(), micro).backward()
    job.step()
print("done", job.step_no, flush=True)
"""


class WorldBatch(unittest.TestCase):
    def test_trap6_a_global_batch_computed_from_the_world_is_named(self):
        # was: "config 'global_batch' is 16, expected 8", which does not say why
        d = rktest.tmpdir(self)
        script = os.path.join(d, "world.py")
        with open(script, "w") as f:
            f.write(WORLD)
        env = rktest.env_with_pythonpath()
        for k in ENV:
            env.pop(k, None)
        ck = os.path.join(d, "ck")
        procs = [subprocess.Popen([sys.executable, script, str(r), "2", os.path.join(d, "s2"), ck], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
        outs = [p.communicate(timeout=600) for p in procs]
        self.assertEqual([p.returncode for p in procs], [0, 0], outs[0][1][-2000:])
        p = subprocess.run([sys.executable, script, "0", "1", os.path.join(d, "s1"), ck], env=env,
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr[-2000:])
        self.assertIn("global batch 16 on 2 ranks, this run's 8 on 1: global_batch changes with the number of "
                      "ranks (computed from it, as micro-batch x accumulation x world?); the global batch must be "
                      "fixed", p.stdout)


if __name__ == "__main__":
    unittest.main()
