"""rekindle.torch: a PyTorch DDP training loop under rk run, protected.

A DDP script keeps its init_process_group, DDP(model), optimiser and loss; it creates one
Job after them and changes three lines of its loop (docs/pytorch.md):

    job = rekindle.torch.Job(model, opt, global_batch=B, data_size=len(dataset))
    for step in job.steps(total):                  # was: for step in range(total)
        idx = ...                                  # this rank's share of global batch `step`
        opt.zero_grad()
        loss = job.scale(loss_fn(model(x), y), len(idx))
        loss.backward()
        job.step()                                 # was: opt.step()

The Job resumes from the newest good checkpoint (model, optimiser, RNG states, data
position; world-size independent), speaks the heartbeat protocol, applies RK_INJECT faults,
runs the step guards of docs/guards.md, checkpoints every N steps and on stop, and exits with
the protocol's statuses. A step that a guard rejects is not applied: `steps` yields the same
step again and the loop body runs again on the same batch (redo); after a rollback it yields
the steps since the snapshot again (replay).
"""

import copy
import json
import math
import os
import random
import signal
import struct
import sys
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as _DDP

import rekindle
from rekindle import ckpt as _ckpt
from rekindle import inject as _inject
from rekindle.torch._hook import _comm_hook
from rekindle.torch._state import _DTYPES, _blob, _item, _optim_tensors, _tensor, params_hash, state_hash
from rekindle.torch.data import StepBatches, batch_indices
from rekindle.torch.guards import grad_outliers, spike_zscore

__all__ = ["Job", "state_hash", "params_hash", "grad_outliers", "spike_zscore", "batch_indices", "StepBatches"]

EXIT_FAIL = getattr(rekindle, "EXIT_FAIL", 1)
EXIT_USAGE = getattr(rekindle, "EXIT_USAGE", 2)
EXIT_COMM = getattr(rekindle, "EXIT_COMM", 3)
EXIT_STOPPED = getattr(rekindle, "EXIT_STOPPED", 4)
EXIT_GUARD = getattr(rekindle, "EXIT_GUARD", 5)
EXIT_STORAGE = getattr(rekindle, "EXIT_STORAGE", 6)


# Layout of the vector each step's gradient all-reduce carries (summed over ranks): the
# scaled loss, the sample count, three command flags, one gradient-norm slot per rank, then
# four slots per rank for a replica hash in 16-bit pieces (exact in float32; zeros on steps
# without one: the length never changes, nor, with it, the all-reduce's summation order).
_V_LOSS, _V_COUNT, _V_STOP, _V_CKPT, _V_LOST, _V_NORMS = range(6)
_SPIKE_WINDOW = 32
_COMM_GRACE_S = 10.0  # a survivor of a peer's death waits this long for rk run's teardown


def _comm_error(exc):
    text = f"{type(exc).__name__}: {exc}"
    return isinstance(exc, (RuntimeError, ConnectionError)) and any(
        w in text for w in ("Gloo", "gloo", "NCCL", "Connection", "connection", "peer", "Broken pipe",
                            "timed out", "Timed out", "ProcessGroup", "closed", "reset"))


def _device_error(exc):
    """A RuntimeError that names the device (a CUDA error, an ECC error, NCCL): a device failure."""
    text = f"{exc}"
    return isinstance(exc, RuntimeError) and any(w in text for w in ("CUDA error", "ECC", "NCCL"))


def _where(exc):
    """ "ExcType: message (file:line)", the innermost frame of the traceback."""
    tb = traceback.extract_tb(exc.__traceback__)
    at = f" ({os.path.basename(tb[-1].filename)}:{tb[-1].lineno})" if tb else ""
    msg = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {msg[:400]}{at}"


_SCALER_JOB = []  # the Job that an enabled GradScaler's scale() refuses (one per process)


def _refuse_grad_scaler(job):
    """torch.cuda.amp.GradScaler skips optimiser steps of its own and keeps a scale that is
    neither checkpointed nor rolled back: not supported yet. An enabled one is refused when
    it first scales a loss (a disabled one, as on a CPU, changes nothing and passes)."""
    _SCALER_JOB[:] = [job]
    gs = getattr(getattr(torch.cuda, "amp", None), "GradScaler", None)
    if gs is None or getattr(gs, "_rk_refused", False):
        return
    orig = gs.scale

    def scale(self, outputs):
        if self.is_enabled() and _SCALER_JOB:
            _SCALER_JOB[0]._usage("torch.cuda.amp.GradScaler is not supported yet: train in fp32, or "
                                  "with bf16 autocast and no scaler")
        return orig(self, outputs)

    gs.scale = scale
    gs._rk_refused = True


def _jsonable(obj):
    """A scheduler's state dict as JSON can hold it (what it cannot, a function, becomes None)."""
    return json.loads(json.dumps(obj, default=lambda o: None))


def _like(saved, cur):
    """`saved` (read back from JSON) with the containers of `cur`: tuples where it had tuples
    (Adam's betas), its keys' order first."""
    if isinstance(cur, dict) and isinstance(saved, dict):
        out = {k: _like(saved[k], cur[k]) for k in cur if k in saved}
        out.update((k, v) for k, v in saved.items() if k not in out)
        return out
    if isinstance(cur, (tuple, list)) and isinstance(saved, list) and len(cur) == len(saved):
        return type(cur)(_like(a, b) for a, b in zip(saved, cur))
    return saved


def injected_hang_sleeping_forever(step):
    """An injected `hang` fault: this rank stops making progress here, on purpose."""
    while True:
        time.sleep(3600)


class Job:
    """One rank's side of a protected training job. See the module's docstring."""

    def __init__(self, model, optimizer, *, global_batch, data_size=0, name="pytorch", ckpt_every=500,
                 hash_every=10, guard=True, spike_z=10.0, grad_ratio=1000.0, keep=3, ckpt_dir=None,
                 resume=None, config=None, verbose=True, scheduler=None):
        if global_batch < 1:
            raise ValueError("global_batch must be >= 1")
        self.model = model
        self.module = model.module if isinstance(model, _DDP) else model
        self.opt = optimizer
        self.scheduler = scheduler  # stepped after each applied step, saved and rolled back with it
        self.global_batch = int(global_batch)
        self.data_size = int(data_size)
        self.name = name
        self.ckpt_every = int(ckpt_every)
        self.hash_every = int(hash_every)
        self.guard = bool(guard)
        self.spike_z = float(spike_z)
        self.grad_ratio = float(grad_ratio)
        self.keep = int(keep)
        self.verbose = verbose
        self.extra_config = dict(config or {})
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        first = next(iter(self.module.parameters()), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self.w = rekindle.Worker()
        self.ckpt_dir = ckpt_dir or self.w.ckpt_dir
        self.resume = self.w.resume if resume is None else bool(resume)
        self.step_no = 0
        self.start_step = 0
        self.loss = None  # the global mean loss of the last applied step
        self._losses = []
        self._snap = None
        self._fresh = False  # the snapshot is of the state now: no step attempt began since
        self._saved_step = -1
        self._flags = [0.0, 0.0, 0.0]  # agreed stop, checkpoint, lost (from the last step)
        self._stop_local = False
        self._lock = None
        self._hook_calls = 0
        self._comm_sent = False
        self._redsums = []  # the reduced buckets' float64 sums (the hook's)
        self._sumsq = None
        self._vec = None
        self._loss_t = None
        self._count = None
        self._nan = False
        self._gradflip = False
        self._slow = None  # [ms, steps left or None]
        self._attempt = None
        self._accepted = False
        self._trips = 0
        self._suspect = None
        self._spiked = None
        self._rolled_at = -1
        self._t0 = 0.0
        self._t0_step = -1
        self._told_batch = False
        self.global_samples = 0
        self._local_ckpt = False
        self._step_rng = None
        self._buffers = list(self.module.buffers())
        self._step_bufs = []
        self._in_steps = False
        self._scaled = 0
        self._install_excepthook()
        _refuse_grad_scaler(self)
        try:
            self.inj = _inject.from_env(self.rank, self.w.launch)
        except ValueError as e:
            self._usage(str(e) if str(e).startswith("RK_INJECT") else f"RK_INJECT: {e}")
        self._armed = time.monotonic()
        if self.ckpt_dir and self.rank == 0:
            try:  # skipped under rk run for RK_CKPT_DIR, which rk run holds
                self._lock = _ckpt.lock(self.ckpt_dir)
            except _ckpt.StorageError as e:
                self._storage(str(e))
            except _ckpt.CheckpointError as e:  # another job holds it
                self._usage(str(e))
        self._hash_buffers = True
        self._pindex = {id(p): i for i, p in enumerate(self.module.parameters())}
        self._perms = {}
        self._pending = None
        self._rolled_back = False
        if isinstance(model, _DDP):
            # the group's own allreduce: dist.all_reduce's checks cost 75 us a call
            self._pg = getattr(model, "process_group", None) or dist.distributed_c10d._get_default_group()
            self._ar_opts = dist.AllreduceOptions()
            model.register_comm_hook(self, _comm_hook)
            if self.world > 1 and getattr(model, "will_sync_module_buffers", lambda: False)():
                # the forward starts with a collective of its own (the buffers' broadcast)
                model.register_forward_pre_hook(lambda mod, inputs: self._comm())
                # each rank's forward leaves its own batch's statistics in the buffers; the
                # next forward overwrites them with rank 0's: they are no replica's state
                self._hash_buffers = False
        if self.resume and self.ckpt_dir:
            self._resume()
        self.w.hello(self.step_no)

    # ----------------------------------------------------------------- the loop

    def steps(self, total):
        """Yields the step to compute (steps applied so far) until `total` are applied; a
        redone step is yielded again, a rollback yields the replayed steps again. At the end
        it checkpoints (with a checkpoint directory) and says bye."""
        self._in_steps = True
        while True:
            if not self._boundary(total):
                continue  # rolled back: replay
            if self.step_no >= total:
                break
            self._begin()
            yield self.step_no
            if self._attempt is not None:
                raise RuntimeError("rekindle.torch: the loop body must call job.step() once per step")
        self._barrier()  # leave together: a group torn down while a peer still saves or sends aborts
        self._in_steps = False
        if sys.excepthook is self._hook:
            sys.excepthook = self._prev_hook
        if self._lock is not None:
            _ckpt.unlock(self._lock)
            self._lock = None
        self.w.bye(self.step_no, "done")

    def scale(self, loss, n):
        """The rank's loss (a mean over its n samples) scaled so that DDP's average of the
        ranks' gradients is the mean over the global batch: loss * world * n / global_batch."""
        self._scaled += 1
        if self._scaled > 1:
            self._usage("job.scale was called twice in one step: gradient accumulation (several "
                        "micro-batches a step) is not supported yet; give each step one batch")
        self._count = int(n)
        factor = self.world * self._count / self.global_batch
        out = loss * factor
        if self._nan:
            self._nan = False
            out = out * float("nan")
        self._loss_t = out.detach()
        return out

    def loader(self, dataset, seed=0, **kw):
        """An iterator whose next() is this rank's share of the current step's global batch
        (batch_indices of the step, through a DataLoader with its own generator: the global
        RNG is never drawn from). One next() per step, in the loop body: a redo, a replay or a
        resume gets the step's own samples. kw goes to DataLoader (collate_fn, pin_memory);
        workers read ahead of the step and are refused."""
        if kw.get("num_workers", 0):
            raise ValueError("rekindle.torch: Job.loader: num_workers > 0 reads ahead of the step; not supported yet")
        for k in ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last", "generator"):
            if k in kw:
                raise ValueError(f"rekindle.torch: Job.loader: {k} is the Job's (the global batch, the step)")
        if not self.data_size:
            self.data_size = len(dataset)
        sampler = StepBatches(self, len(dataset), seed)
        return iter(torch.utils.data.DataLoader(dataset, batch_sampler=sampler, generator=torch.Generator(), **kw))

    def step(self):
        """Judges the step's numbers (the guards) and applies the optimiser step, or marks
        the step for a redo. Call it where the script called optimizer.step()."""
        if self._attempt is None:
            raise RuntimeError("rekindle.torch: job.step() outside job.steps()")
        if self._loss_t is None:
            raise RuntimeError("rekindle.torch: call job.scale(loss, n) on the loss before backward()")
        v = self._gathered()
        self._loss_t = None
        self._attempt = None
        loss = v[_V_LOSS] / self.world
        norms = v[_V_NORMS:_V_NORMS + self.world]
        self._flags = [v[_V_STOP], v[_V_CKPT], v[_V_LOST]]
        self.global_samples = int(round(v[_V_COUNT]))
        if self.global_samples != self.global_batch:
            self._usage(f"ranks' samples sum to {self.global_samples}, global_batch is {self.global_batch}: "
                        "split the global batch over the ranks (rekindle.torch.batch_indices)")
        if self._pending is not None:
            base = _V_NORMS + self.world
            hashes = [sum(int(v[base + 4 * q + i]) << (16 * i) for i in range(4)) for q in range(self.world)]
            pending, self._pending = self._pending, None
            if all(h == hashes[0] for h in hashes):
                self._snap = pending
            else:
                self._repair(hashes, pending)
                return False
        self._rolled_back = False
        if self.guard and not self._judge(loss, norms, self._reduced_finite()):
            if not self._rolled_back:  # a rollback set the snapshot's RNG states already
                self._redo()
            return False
        self.opt.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.step_no += 1
        self.loss = loss
        if math.isfinite(loss):
            self._losses = (self._losses + [loss])[-_SPIKE_WINDOW:]
        self._trips = 0
        self._suspect = None
        self._spiked = None
        self._accepted = True
        if not self._told_batch:
            self._told_batch = True
            if self.rank == 0:
                ranks = f"{self.world} rank{'' if self.world == 1 else 's'}"
                self._say(f"global batch {self.global_samples} samples over {ranks} "
                          f"(this rank {self._count}; global_batch {self.global_batch})")
        self.w.step(self.step_no, loss, time.monotonic() - self._t0)
        return True

    # ----------------------------------------------------------------- guards

    def _reduced_finite(self):
        """Whether the all-reduced gradients are finite (their float64 sums, taken per bucket
        by the hook): a sum can be non-finite where every rank's own gradient was finite."""
        sums, self._redsums = self._redsums, []
        return not sums or math.isfinite(float(torch.stack(sums).sum()))

    def _judge(self, loss, norms, reduced=True):
        bad = [r for r, x in enumerate(norms) if not math.isfinite(x)]
        if not bad and math.isfinite(loss) and not reduced:
            self._event("nan", -1, "redo", 0, "non-finite sum of the ranks' gradients (each rank's own "
                        "is finite); step redone")
            return self._trip()
        if bad or not math.isfinite(loss):
            blame = bad[0] if bad else -1
            what = "gradient" if bad else "loss"
            self._event("nan", blame, "redo", 0, f"non-finite {what} on rank {blame}; step redone")
            return self._trip()
        out = self._outliers(norms)
        if self._suspect is not None:
            r, bits = self._suspect
            if out == [r] and struct.pack("<d", norms[r]) == bits:
                self._event("grad_kept", -1, "kept", 0,
                            f"rank {r}'s gradient norm {norms[r]:.6g} came back bit for bit on the redo: "
                            "the data")
                self._suspect = None
                out = []
            elif not out:
                self._event("grad_outlier", r, "redo", 0,
                            f"rank {r}'s gradient norm was an outlier and the redo was clean: "
                            "a transient fault")
                self._suspect = None
        if out:
            r = out[0]
            others = [x for i, x in enumerate(norms) if i != r]
            self._event("grad_suspect", r, "redo", 0,
                        f"rank {r}'s gradient norm {norms[r]:.6g} is far off the others' "
                        f"(median {float(np.median(others)):.6g})")
            self._suspect = (r, struct.pack("<d", norms[r]))
            return self._trip()
        if len(self._losses) >= _SPIKE_WINDOW:
            z = self._zscore(loss)
            if z > self.spike_z:
                bits = struct.pack("<d", loss)
                if self._spiked == bits:
                    self._event("spike_kept", -1, "kept", 0,
                                f"loss {loss:.6g} (z {z:.1f}) again on the redo: the data")
                    return True
                self._spiked = bits
                self._event("loss_spike", -1, "redo", 0,
                            f"loss {loss:.6g}, robust z-score {z:.1f}; step redone")
                return False
        return True

    def _outliers(self, norms):
        return grad_outliers(norms, self.grad_ratio)

    def _zscore(self, loss):
        return spike_zscore(self._losses, loss)

    def _trip(self):
        self._trips += 1
        if self._trips >= 3:
            if self._snap is not None and self._rolled_at != self.step_no:
                self._rolled_at = self.step_no
                lost = self.step_no - self._snap["step"]
                self._event("guard_rollback", -1, "rollback", lost,
                            f"3 guard trips at step {self.step_no}; back to the verified state of "
                            f"step {self._snap['step']}")
                self._restore(self._snap)
                self._trips = 0
                return False
            self._fail_guard(f"3 guard trips at step {self.step_no} and no recovery")
        return False

    def _redo(self):
        self._restore_rng(self._step_rng)
        if self._step_bufs:
            with torch.no_grad():
                for b, saved in zip(self._buffers, self._step_bufs):
                    b.copy_(saved)

    # ----------------------------------------------------------------- step boundary

    def _begin(self):
        if self._t0_step != self.step_no:
            self._t0, self._t0_step = time.monotonic(), self.step_no
        self._accepted = False
        self._attempt = self.step_no
        self._fresh = False  # a redone attempt may have changed the state (a bit flip): verify again
        self._step_rng = self._capture_rng(cheap=True)
        # the forward updates buffers (BatchNorm's running statistics) before step() judges:
        # a redo puts them back (they are small)
        self._step_bufs = [b.detach().clone() for b in self._buffers]
        cmds = self.w.poll()
        if "stop" in cmds:
            self._stop_local = True
        self._local_ckpt = "checkpoint" in cmds
        self._hook_calls = 0
        self._comm_sent = False
        self._redsums = []
        self._scaled = 0
        self._sumsq = None
        self._vec = None
        if self.inj is not None:
            for f in self.inj.due(self.step_no, time.monotonic() - self._armed):
                self._fire(f)
        if self._slow is not None:
            ms, left = self._slow
            time.sleep(ms / 1000.0)
            if left is not None:
                left -= 1
                self._slow = None if left <= 0 else [ms, left]

    def _boundary(self, total):
        """Between steps: the agreed commands, the replica check, checkpoints, the stop.
        False after a rollback (the loop replays)."""
        stop, want_ckpt, lost = (x > 0 for x in self._flags)
        if lost:
            self._say("the supervisor is gone; stopping without a checkpoint")
            self._exit(EXIT_FAIL)
        final = self.step_no >= total
        save = bool(self.ckpt_dir) and self.step_no != self._saved_step and (
            stop or want_ckpt or final or (self.ckpt_every > 0 and self.step_no % self.ckpt_every == 0
                                           and self.step_no > self.start_step))
        verified = self._fresh and self._snap is not None and self._snap["step"] == self.step_no
        if self.guard and self.hash_every > 0 and not verified:
            if save or stop or final:  # only a verified state is saved or handed back
                if not self._replica_check():
                    return False
            elif self._snap is None or self.step_no % self.hash_every == 0:
                # the hash rides in this step's all-reduce; step() compares them
                if self._pending is None or self._pending["step"] != self.step_no:
                    self._pending = self._snapshot()
                    self._pending["hash"] = state_hash(self.module, self.opt, self._hash_buffers)
        if save:
            self._save()
        if stop:
            if self.rank == 0:
                self._say(f"stopped on command at step {self.step_no}" +
                          (" with its checkpoint saved" if self.ckpt_dir else " (no checkpoint directory)"))
            self.w.bye(self.step_no, "stopped")
            self._barrier()
            self._exit(EXIT_STOPPED)
        return True

    # ----------------------------------------------------------------- faults

    def _fire(self, f):
        self.w.inject(self.step_no, f.index, f.kind)
        self._say(f"simulated fault {f.kind} (index {f.index}) at step {self.step_no}")
        if f.kind == "crash":
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        elif f.kind == "hang":
            sys.stdout.flush()
            sys.stderr.flush()
            injected_hang_sleeping_forever(self.step_no)
        elif f.kind == "nan":
            self._nan = True
        elif f.kind == "gradflip":
            self._gradflip = True
        elif f.kind == "bitflip":
            self._bitflip()
        elif f.kind == "slow":
            self._slow = [f.ms or 100, f.for_ or None]
        elif f.kind == "commfail":
            self.w.exit_event(self.step_no, "commfail",
                              f"simulated collective failure at step {self.step_no}")
            self._exit(EXIT_COMM)

    def _bitflip(self):
        params = [p for p in self.module.parameters() if p.numel() > 0 and p.dtype == torch.float32]
        if not params:
            return
        p = params[self.step_no % len(params)]
        with torch.no_grad():
            flat = p.data.view(-1).view(torch.int32)
            i = self.step_no % p.numel()
            flat[i] = flat[i] ^ (1 << 22)

    def _flip_grad(self, buf):
        """Bit 30 (the exponent's top bit) of one element in (0, 1): it grows by 2^128."""
        if buf.dtype != torch.float32:
            return
        cand = ((buf.abs() < 1) & (buf != 0)).nonzero()
        if cand.numel() == 0:
            return
        i = int(cand[0])
        iv = buf.view(torch.int32)
        iv[i] = iv[i] ^ (1 << 30)

    # ----------------------------------------------------------------- collectives

    def _vector(self, sumsq, dtype, device):
        if self._count is None or self._loss_t is None:
            raise RuntimeError("rekindle.torch: call job.scale(loss, n) on the loss before backward()")
        factor = self.world * self._count / self.global_batch
        r, world = self.rank, self.world
        h = self._pending["hash"] if self._pending is not None else 0
        flags = [float(self._count), float(self._stop_local), float(self._local_ckpt), float(self.w.lost)]
        tail = ([0.0] * (world - r - 1 + 4 * r) + [float((h >> (16 * i)) & 0xFFFF) for i in range(4)]
                + [0.0] * (4 * (world - r - 1)))
        if device.type == "cpu":  # one tensor from Python numbers: a third of the torch calls
            norm = math.sqrt(float(sumsq)) / factor if factor > 0 else 0.0
            return torch.tensor([float(self._loss_t)] + flags + [0.0] * r + [norm] + tail, dtype=dtype)
        head = torch.tensor(flags + [0.0] * r, dtype=dtype, device=device)
        norm = (sumsq.sqrt() / factor if factor > 0 else sumsq * 0).reshape(1).to(dtype)
        tail = torch.tensor(tail, dtype=dtype, device=device)
        return torch.cat([self._loss_t.reshape(1).to(dtype), head, norm, tail])

    def _gathered(self):
        if self._vec is None:
            # not DDP (one process), or DDP found nothing to reduce: judge local numbers
            sq = torch.zeros((), dtype=torch.float64, device=self.device)
            grads = [p.grad for p in self.module.parameters() if p.grad is not None]
            if self._gradflip and grads:
                self._gradflip = False
                self._flip_grad(grads[0].view(-1))
            for g in grads:
                sq = sq + g.detach().to(torch.float64).pow(2).sum()
            v = self._vector(sq, torch.float64, self.device)
            if self.distributed and self.world > 1:
                self._comm()
                self._collective(dist.all_reduce, v)
            self._vec = v
        out = self._vec.to(torch.float64).cpu().tolist()
        self._vec = None
        self._sumsq = None
        return out

    def _comm(self):
        """The `comm` heartbeat, once a step attempt, before its first collective."""
        if not self._comm_sent and self._attempt is not None:
            self._comm_sent = True
            self.w.comm(self.step_no)

    def _collective(self, fn, *a, **kw):
        try:
            return fn(*a, **kw)
        except Exception as e:
            self._comm_failed(e)

    def _barrier(self):
        if self.distributed and self.world > 1:
            self._collective(dist.barrier)

    # ----------------------------------------------------------------- replica hashes

    def _hashes(self):
        h = state_hash(self.module, self.opt, self._hash_buffers)
        mine = torch.tensor([h - (1 << 64) if h >= 1 << 63 else h], dtype=torch.int64, device=self.device)
        if not (self.distributed and self.world > 1):
            return [int(mine)]
        out = [torch.zeros_like(mine) for _ in range(self.world)]
        self._collective(dist.all_gather, out, mine)
        return [int(t) for t in out]

    def _replica_check(self):
        """An explicit check (one all-gather): before a checkpoint, a stop and the end."""
        self._pending = None
        hashes = self._hashes()
        if all(h == hashes[0] for h in hashes):
            self._snap = self._snapshot()
            self._fresh = True
            return True
        self._repair(hashes)
        return False

    def _repair(self, hashes, pending=None):
        """Replica hashes differ: every rank returns to the last verified snapshot (none yet:
        the state of this step's start, `pending`), the majority's copy is broadcast, the steps
        since are replayed."""
        counts = [hashes.count(h) for h in hashes]
        root = max(range(len(hashes)), key=lambda r: (counts[r], -r))
        minority = [r for r, h in enumerate(hashes) if h != hashes[root]]
        strict = counts[root] * 2 > len(hashes)
        blame = minority[0] if strict and len(minority) == 1 else -1
        snap = self._snap if self._snap is not None else pending
        at = self.step_no
        lost = at - snap["step"] if snap is not None else 0
        if snap is not None:
            self._restore(snap)
        self._broadcast_state(root)
        again = self._hashes()
        if any(h != again[0] for h in again):
            self._fail_guard("replica hashes still differ after the repair from the majority")
        self._snap = self._snapshot()
        self._fresh = True
        if len(hashes) == 2:  # which one is wrong cannot be told
            what = "replica hashes of ranks 0 and 1 differ (no majority: rank 0's copy kept)"
        elif not strict:
            what = f"replica hashes differ with no majority (rank {root}'s copy kept)"
        else:
            what = f"replica hash of rank(s) {','.join(str(r) for r in minority)} differs"
        self._event("replica_mismatch", blame, "rollback", lost,
                    f"{what}; back to the verified state of step {self.step_no}, rank {root}'s copy "
                    f"broadcast, {lost} steps replayed", step=at)

    def _broadcast_state(self, root):
        if not (self.distributed and self.world > 1):
            return
        with torch.no_grad():
            for t in list(self.module.state_dict().values()) + _optim_tensors(self.opt):
                self._collective(dist.broadcast, t, root)

    def _snapshot(self):
        state = {}
        for i, (_, p) in enumerate(self._param_names()):
            st = self.opt.state.get(p)
            if st:
                state[i] = {k: (v.detach().clone() if torch.is_tensor(v) else copy.deepcopy(v))
                            for k, v in st.items()}
        return {
            "step": self.step_no,
            "model": {k: v.detach().clone() for k, v in self.module.state_dict().items()},
            "optim": state,
            "groups": [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
                       for g in self.opt.param_groups],
            "rng": self._capture_rng(),
            "losses": list(self._losses),
            "sched": copy.deepcopy(self.scheduler.state_dict()) if self.scheduler is not None else None,
        }

    def _restore(self, snap):
        with torch.no_grad():
            self.module.load_state_dict(snap["model"])
        cur = self.opt.state_dict()["param_groups"]
        self.opt.load_state_dict({
            "state": {i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in st.items()}
                      for i, st in snap["optim"].items()},
            "param_groups": [dict(g, params=c["params"]) for g, c in zip(snap["groups"], cur)],
        })
        self._restore_rng(snap["rng"])
        self._fresh = snap is self._snap
        if snap.get("sched") is not None:
            self.scheduler.load_state_dict(copy.deepcopy(snap["sched"]))
        self._rolled_back = True
        self._losses = list(snap["losses"])
        self.step_no = snap["step"]
        self._suspect = None
        self._spiked = None
        self._attempt = None

    # ----------------------------------------------------------------- RNG states

    def _capture_rng(self, cheap=False):
        """The RNG states; `cheap` (every step, for a redo) is torch's (CPU and CUDA) alone:
        saving numpy's and Python's global generators costs 10 to 75 us, 1 to 2% of a small
        model's step."""
        st = {"torch": torch.get_rng_state()}
        if not cheap:
            st["numpy"] = np.random.get_state()
            st["random"] = random.getstate()
        if self.device.type == "cuda":
            st["cuda"] = torch.cuda.get_rng_state(self.device)
        return st

    def _restore_rng(self, st):
        torch.set_rng_state(st["torch"])
        if "numpy" in st:
            np.random.set_state(st["numpy"])
        if "random" in st:
            random.setstate(st["random"])
        if "cuda" in st and self.device.type == "cuda":
            torch.cuda.set_rng_state(st["cuda"], self.device)

    # ----------------------------------------------------------------- checkpoints

    @property
    def epoch(self):
        """Epochs started before the current step (the data position, with `cursor`)."""
        per = self.data_size // self.global_batch if self.data_size else 0
        return self.step_no // per if per else 0

    @property
    def cursor(self):
        """Samples of the current epoch consumed before the current step."""
        per = self.data_size // self.global_batch if self.data_size else 0
        return (self.step_no % per if per else self.step_no) * self.global_batch

    def _param_names(self):
        names = {id(p): n for n, p in self.module.named_parameters()}
        out = []
        for group in self.opt.param_groups:
            for p in group["params"]:
                out.append((names.get(id(p), f"param{len(out)}"), p))
        return out

    def _items(self, rngs):
        items = [_item("model." + k, v) for k, v in self.module.state_dict().items()]
        extra, order = {}, {}
        for pname, p in self._param_names():
            order[pname] = list(self.opt.state.get(p, {}))
            for k in sorted(self.opt.state.get(p, {})):
                v = self.opt.state[p][k]
                if torch.is_tensor(v):
                    items.append(_item(f"optim.{pname}.{k}", v))
                else:
                    extra.setdefault(pname, {})[k] = v
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.opt.param_groups]
        items.append(_blob("optim.param_groups", {"groups": groups, "extra": extra, "order": order}))
        if self.scheduler is not None:
            items.append(_blob("sched", _jsonable(self.scheduler.state_dict())))
        for r, rng in enumerate(rngs):  # rank 0's as rng.*, the others' as rng.*.rank<R>
            items += self._rng_items(rng, "" if r == 0 else f".rank{r}")
        for k, val in (("epoch", self.epoch), ("cursor", self.cursor), ("global_batch", self.global_batch),
                       ("size", self.data_size)):
            items.append(_ckpt.Item("data." + k, "I64", (), struct.pack("<q", val)))
        items.append(_ckpt.Item("guard.losses", "F64", (len(self._losses),),
                                struct.pack(f"<{len(self._losses)}d", *self._losses)))
        return items

    @staticmethod
    def _rng_items(rng, suffix):
        items = [_item("rng.torch" + suffix, rng["torch"])]
        if "cuda" in rng:
            items.append(_item("rng.cuda" + suffix, rng["cuda"]))
        kind, keys, pos, has_gauss, cached = rng["numpy"]
        items.append(_blob("rng.numpy" + suffix, {"kind": kind, "keys": [int(k) for k in keys], "pos": int(pos),
                                                  "has_gauss": int(has_gauss), "cached": float(cached)}))
        version, state, gauss = rng["random"]
        items.append(_blob("rng.random" + suffix, {"version": version, "state": list(state), "gauss": gauss}))
        return items

    def _rank_rngs(self):
        """Every rank's RNG states, on rank 0 (one gather of a few KiB, at a checkpoint)."""
        mine = self._capture_rng()
        if not (self.distributed and self.world > 1):
            return [mine]
        mine = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in mine.items()}
        out = [None] * self.world
        self._collective(dist.all_gather_object, out, mine)
        return out

    def _save(self):
        self._saved_step = self.step_no
        rngs = self._rank_rngs()
        if self.rank != 0:
            return
        if not self.w.alive():
            self._say("the supervisor is gone: no checkpoint written")
            return
        config = dict(self.extra_config, model=self.name, framework="pytorch", global_batch=self.global_batch)
        t = time.monotonic()
        try:
            _ckpt.save(self.ckpt_dir, self.step_no, self._items(rngs), epoch=self.epoch, cursor=self.cursor,
                       world_size=self.world, config=json.dumps(config, sort_keys=True), keep=self.keep)
        except _ckpt.StorageError as e:
            self._storage(f"{self.ckpt_dir}: cannot save the checkpoint of step {self.step_no}: {e}")
        except _ckpt.CheckpointError as e:
            self._fail_guard(f"checkpoint of step {self.step_no} refused: {e}")
        self.w.ckpt(self.step_no, time.monotonic() - t)

    def _mismatch(self, ck):
        """What makes checkpoint `ck` another run's (None: none): the config's model, framework
        and global batch, the state dict's tensors, the data size, the parameter groups."""
        expect = {"config": {"model": self.name, "framework": "pytorch", "global_batch": self.global_batch},
                  "items": {"model." + k: (_DTYPES.get(v.dtype, str(v.dtype)), tuple(v.shape))
                            for k, v in self.module.state_dict().items()}}
        try:
            _ckpt.check(ck, expect)
        except _ckpt.CheckpointError as e:
            return str(e)
        it = ck.items.get("data.size")
        if it is not None and self.data_size:
            size = struct.unpack("<q", bytes(it.data))[0]
            if size and size != self.data_size:
                return f"{ck.path}: data size {size}, this run's is {self.data_size}"
        it = ck.items.get("optim.param_groups")
        if it is not None:
            n = len(json.loads(bytes(it.data).decode()).get("groups", []))
            if n != len(self.opt.param_groups):
                return f"{ck.path}: {n} parameter groups, this run's optimiser has {len(self.opt.param_groups)}"
        return None

    def _resume(self):
        path = None
        bad = None
        if self.rank == 0:
            try:
                ck, skipped = _ckpt.load_latest(self.ckpt_dir)
            except _ckpt.StorageError as e:
                self._storage(str(e))
            except _ckpt.CheckpointError as e:  # exists but cannot be read: not skipped
                self._storage(str(e))
            for s in skipped:
                self._say(f"resume skipped {s}")
            if ck is not None:
                path = ck.path
                bad = self._mismatch(ck)
        if self.distributed and self.world > 1:
            box = [path, bad]
            self._collective(dist.broadcast_object_list, box, 0)
            path, bad = box
            if bad is not None:
                ck = None
            ck = _ckpt.load(path) if path and self.rank != 0 else (ck if self.rank == 0 else None)
        if bad is not None:  # training from scratch over another run's checkpoints is no resume
            self._usage(f"cannot resume from another run's checkpoint: {bad}")
        if path is None:
            return
        try:
            self._apply(ck)
        except (KeyError, ValueError, RuntimeError) as e:
            self._usage(f"{path}: cannot resume this model from it: {e}")
        self._say(f"resumed from {path} (step {ck.step}, epoch {ck.epoch}, cursor {ck.cursor}, "
                  f"written by {ck.world_size} ranks; now {self.world})")

    def _apply(self, ck):
        items = ck.items
        sd = self.module.state_dict()
        state = {}
        for k in sd:
            state[k] = _tensor(items["model." + k])
        self.module.load_state_dict(state)
        meta = json.loads(bytes(items["optim.param_groups"].data).decode())
        osd = self.opt.state_dict()
        new_state = {}
        for i, (pname, p) in enumerate(self._param_names()):
            pre = f"optim.{pname}."
            s = {n[len(pre):]: _tensor(it) for n, it in items.items()
                 if n.startswith(pre) and "." not in n[len(pre):]}
            s.update(meta["extra"].get(pname, {}))
            keys = meta.get("order", {}).get(pname)
            if keys and sorted(keys) == sorted(s):  # the optimiser's own key order
                s = {k: s[k] for k in keys}
            if s:
                new_state[i] = s
        groups = []
        for g, saved in zip(osd["param_groups"], meta["groups"]):
            groups.append(dict(_like(saved, {k: v for k, v in g.items() if k != "params"}), params=g["params"]))
        self.opt.load_state_dict({"state": new_state, "param_groups": groups})
        # this rank's own RNG states when the world size is the checkpoint's; on another world
        # size (or from a checkpoint without them) rank 0's on every rank
        suffix = f".rank{self.rank}" if self.rank > 0 and ck.world_size == self.world else ""
        if "rng.torch" + suffix not in items:
            suffix = ""
        rng = {"torch": _tensor(items["rng.torch" + suffix])}
        if "rng.cuda" + suffix in items and self.device.type == "cuda":
            rng["cuda"] = _tensor(items["rng.cuda" + suffix])
        n = json.loads(bytes(items["rng.numpy" + suffix].data).decode())
        rng["numpy"] = (n["kind"], np.array(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached"])
        r = json.loads(bytes(items["rng.random" + suffix].data).decode())
        rng["random"] = (r["version"], tuple(r["state"]), r["gauss"])
        self._restore_rng(rng)
        if self.scheduler is not None and "sched" in items:
            saved = json.loads(bytes(items["sched"].data).decode())
            self.scheduler.load_state_dict(_like(saved, self.scheduler.state_dict()))
        if "guard.losses" in items:
            d = bytes(items["guard.losses"].data)
            self._losses = list(struct.unpack(f"<{len(d) // 8}d", d))
        self.step_no = self.start_step = self._saved_step = ck.step

    # ----------------------------------------------------------------- reporting, exits

    def _say(self, msg):
        if self.verbose:
            print(f"rekindle.torch: rank {self.rank}: {msg}", file=sys.stderr, flush=True)

    def _event(self, kind, blame, action, lost, detail, step=None):
        if self.rank == 0:
            step = self.step_no if step is None else step
            self._say(f"step {step}: {kind} (blame {blame}, {action}): {detail}")
            self.w.event(step, kind, blame=blame, action=action, lost_steps=lost, detail=detail)

    def _exit(self, status):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)

    def _usage(self, msg):
        self._say(msg)
        self.w.exit_event(self.step_no, "usage", msg)
        self._exit(EXIT_USAGE)

    def _storage(self, msg):
        self._say(msg)
        self.w.exit_event(self.step_no, "storage", msg)
        self._exit(EXIT_STORAGE)

    def _fail_guard(self, msg):
        self._say(msg)
        self.w.exit_event(self.step_no, "guard_failed", msg)
        self._exit(EXIT_GUARD)

    def _comm_failed(self, exc):
        """A collective failed. Most often a peer died: rk run sees that and tears the job
        down within seconds, so a supervised rank waits a little before reporting a
        communication failure of its own (which would be counted against its device)."""
        self._say(f"collective failed at step {self.step_no}: {type(exc).__name__}: "
                  f"{' '.join(str(exc).split())[:300]}")
        if self.w.supervised:
            deadline = time.monotonic() + _COMM_GRACE_S
            while time.monotonic() < deadline and self.w.alive():
                time.sleep(0.1)
        self.w.exit_event(self.step_no, "commfail", f"collective failed: {' '.join(str(exc).split())[:200]}")
        self._exit(EXIT_COMM)

    def _install_excepthook(self):
        prev = sys.excepthook

        def hook(tp, exc, tb):
            if self._in_steps and exc is not None and _comm_error(exc):
                if os.environ.get("RK_TORCH_TRACEBACK") == "1":
                    traceback.print_exception(tp, exc, tb)
                self._comm_failed(exc)
            prev(tp, exc, tb)
            if exc is not None and not _device_error(exc) and isinstance(exc, Exception):
                # the script's own error: no device's fault (rk run counts it against none)
                self.w.exit_event(self.step_no, "exception", _where(exc))
            self._exit(EXIT_FAIL)

        self._prev_hook, self._hook = prev, hook
        sys.excepthook = hook
