"""rekindle.torch: a PyTorch DDP training loop under rk run, protected.

A DDP script keeps its init_process_group, DDP(model), optimiser, scheduler, loss and its
own loop; it creates one Job after them and changes a few lines (docs/pytorch.md). Its
epoch loop over a DataLoader, gradient accumulation included:

    job = rekindle.torch.Job(model, opt, scheduler=sched, global_batch=B)
    for epoch in job.epochs(n):                    # was: for epoch in range(n)
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(job.batches(loader)):   # was: enumerate(loader)
            ...
            job.scale(loss_fn(model(x), y), len(y)).backward()   # was: (loss / accum).backward()
            if (i + 1) % accum == 0:
                job.step()                         # was: opt.step()
                sched.step()
                opt.zero_grad()

or a loop over steps whose batch is a function of the step:

    for step in job.steps(total):                  # was: for step in range(total)
        idx = ...                                  # this rank's share of global batch `step`
        opt.zero_grad()
        loss = job.scale(loss_fn(model(x), y), len(idx))
        loss.backward()
        job.step()                                 # was: opt.step()

The Job resumes from the newest good checkpoint (model, optimiser, scheduler, RNG states, data
position; world-size independent), speaks the heartbeat protocol, applies RK_INJECT faults,
runs the step guards of docs/guards.md on each optimiser step (not each micro-batch),
checkpoints every N steps and on stop, and exits with the protocol's statuses. A step that a
guard rejects is not applied and is computed again on the same micro-batches (redo); after a
rollback the steps since the snapshot are computed again (replay): job.batches serves them
again from what it read, job.steps yields the steps again.
"""

import copy
import math
import os
import random
import signal
import struct
import sys
import time
import traceback
import weakref

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as _DDP

import rekindle
from rekindle import ckpt as _ckpt
from rekindle import inject as _inject
from rekindle import worker as _worker
from rekindle.torch._checkpoint import _Checkpoints
from rekindle.torch._hook import _comm_hook, guard_buffer_sync, reduce_in
from rekindle.torch._inplace import _InPlace, _Rejoined
from rekindle.torch._memory import _Memory
from rekindle.torch._state import _hash_tensors, _optim_tensors, params_hash, state_hash
from rekindle.torch.data import Batches, StepBatches, batch_indices
from rekindle.torch.guards import grad_outliers, replica_vote, spike_zscore, spike_zscore_over

__all__ = ["Job", "state_hash", "params_hash", "grad_outliers", "spike_zscore", "batch_indices", "StepBatches",
           "Batches"]

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
_V_LOSS, _V_COUNT, _V_STOP, _V_CKPT, _V_LOST, _V_NOSNAP, _V_NORMS = range(7)
_NO_FLAGS = (0.0,) * (_V_NORMS - _V_STOP)  # the agreed flags before any step: none set
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


_SCALER_JOB = []  # a weak reference to the Job that an enabled GradScaler's scale() refuses


def _refuse_grad_scaler(job):
    """torch.cuda.amp.GradScaler skips optimiser steps of its own and keeps a scale that is
    neither checkpointed nor rolled back: not supported yet. An enabled one is refused when
    it first scales a loss (a disabled one, as on a CPU, changes nothing and passes)."""
    _SCALER_JOB[:] = [weakref.ref(job)]
    gs = getattr(getattr(torch.cuda, "amp", None), "GradScaler", None)
    if gs is None or getattr(gs, "_rk_refused", False):
        return
    orig = gs.scale

    def scale(self, outputs):
        job = _SCALER_JOB[0]() if _SCALER_JOB else None
        if self.is_enabled() and job is not None:
            job._usage("torch.cuda.amp.GradScaler is not supported yet: train in fp32, or "
                                  "with bf16 autocast and no scaler")
        return orig(self, outputs)

    gs.scale = scale
    gs._rk_refused = True


def _end_daemons():
    """Ends this process's daemonic multiprocessing children (DataLoader workers) before an
    os._exit, as a normal exit would: a worker still starting when its parent is gone takes
    init for its parent and waits for work forever (torch 1.13's watchdog), holding the
    rank's stdout."""
    import multiprocessing

    try:
        kids = [p for p in multiprocessing.active_children() if p.daemon]
    except Exception:  # noqa: BLE001 - exiting anyway
        return
    for p in kids:
        try:
            p.kill()
        except Exception:  # noqa: BLE001
            pass


def _find_scheduler(opt):
    """A learning-rate scheduler object that drives `opt` (an attribute `optimizer` that is it,
    and step/state_dict methods), or None: looked for once, when the learning rate first
    changes with no scheduler given to the Job."""
    import gc

    def driver(obj):
        d = getattr(obj, "__dict__", None)
        return isinstance(d, dict) and d.get("optimizer") is opt and callable(getattr(obj, "step", None)) and \
            callable(getattr(obj, "state_dict", None))

    for ref in gc.get_referrers(opt):
        if driver(ref):  # an object whose attributes are held inline (Python 3.11)
            return ref
        if isinstance(ref, dict):  # an attribute dict: whose is it
            for obj in gc.get_referrers(ref):
                if getattr(obj, "__dict__", None) is ref and driver(obj):
                    return obj
    return None


def injected_hang_sleeping_forever(step):
    """An injected `hang` fault: this rank stops making progress here, on purpose."""
    while True:
        time.sleep(3600)


class Job(_Checkpoints, _Memory, _InPlace):
    """One rank's side of a protected training job. See the module's docstring."""

    def __init__(self, model, optimizer, *, global_batch, data_size=0, name="pytorch", ckpt_every=500,
                 hash_every=10, guard=True, spike_z=10.0, grad_ratio=1000.0, keep=3, ckpt_dir=None,
                 resume=None, config=None, verbose=True, scheduler=None):
        if global_batch < 1:
            raise ValueError("global_batch must be >= 1")
        _worker.trace_phase("py.job")  # RK_TRACE_LAUNCH: the script's set-up done
        self.model = model
        self.module = model.module if isinstance(model, _DDP) else model
        self.opt = optimizer
        self.scheduler = scheduler  # stepped by the loop; saved, rolled back and put back on a redo
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
        self._flags = list(_NO_FLAGS)  # agreed stop, checkpoint, lost, a rank's snapshots off
        self._stop_local = False
        self._lock = None
        self._hook_calls = 0
        self._comm_sent = False
        self._redsums = []  # the reduced buckets' float64 sums (the hook's, on a GPU)
        self._red_bad = False  # a reduced bucket was not finite (the hook's, on the CPU)
        self._scratch = {}  # per bucket: the hook's all-reduce buffer
        self._sumsq = None
        self._vec = None
        self._loss_t = None  # the scaled loss: a float on the CPU, a tensor on a GPU
        self._count = None
        self._factor = 1.0
        self._vtail = (None, None)  # the vector's tail (the pending hash in its slots), by hash
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
        self._step_groups = None  # the optimiser's hyperparameters at the attempt's start
        self._step_sched = None  # the scheduler's state at the attempt's start
        self._restore_next = None  # what the next attempt puts back first (a redo, a rollback)
        self._lr_manual = False  # the learning rate changed with no scheduler object behind it
        self._in_steps = False
        self._scaled = 0  # job.scale calls (micro-batches) in this attempt
        self._serial = 0  # step attempts begun
        self.accum = None  # micro-batches a step (job.scale calls), learned at the first step
        self._mode = None  # "steps" (job.steps) or "epochs" (job.epochs and job.batches)
        self._epoch_no = 0  # job.epochs: the epoch, and the step it started at
        self._epoch_start = 0
        self._epoch_passes = 0
        self._epoch_snap = False  # the next boundary is an epoch's first: take a snapshot there
        self._skip_steps = 0  # after a resume: steps of the resumed epoch done before it
        self._skip_accum = 0  # the micro-batches a step that the resume's skip assumed
        self._skipped = 0
        self._discard_rng = False  # after a resume: the first loader pass's RNG draws were made already
        self._resume_accum = 0
        self._nf_buffers = {k for k, v in self.module.state_dict(keep_vars=True).items()
                            if not isinstance(v, torch.nn.Parameter) and v.is_floating_point()
                            and not bool(torch.isfinite(v).all())}  # a mask of -inf: the model's own
        self._nf_told = set()
        self._install_excepthook()
        _refuse_grad_scaler(self)
        if self.global_batch < self.world:  # a rank without samples has no mean loss nor norm
            self._usage(f"global_batch {self.global_batch} is smaller than the {self.world} ranks: every "
                        "rank needs a sample a step (as rk train requires)")
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
        # with 3 or more ranks and a DDP that rebuilds its buckets: DDP's initial layout (each
        # bucket's parameters, recorded in the run's first backward); None: the layout never
        # matters. _deferred: the layout the hook deferred a backward's reduction to (_defers)
        self._layouts = None
        self._deferred = None
        self._rebuilt = False  # this Job made DDP rebuild its buckets (DDP's own flag stays False)
        self._backwards = 0  # the attempt's backward passes through the hook
        self._pending = None
        self._rolled_back = False
        if isinstance(model, _DDP):
            # the group's own allreduce: dist.all_reduce's checks cost 75 us a call
            self._pg = getattr(model, "process_group", None) or dist.distributed_c10d._get_default_group()
            self._ar_opts = dist.AllreduceOptions()
            # the hooks hold the Job weakly: a reference from DDP's reducer back to the Job (and
            # through it to the model and the process group) would be a cycle through C++ that
            # only the interpreter's finalization frees, with gloo's threads still running
            me = weakref.ref(self)
            model.register_comm_hook(me, _comm_hook)
            if self.world > 1 and getattr(model, "will_sync_module_buffers", lambda: False)():
                # the forward starts with a collective of its own (the buffers' broadcast)
                model.register_forward_pre_hook(lambda mod, inputs: me() and me()._comm())
                guard_buffer_sync(me, model)  # a peer that dies in it: recovery in place
                # each rank's forward leaves its own batch's statistics in the buffers; the
                # next forward overwrites them with rank 0's: they are no replica's state
                self._hash_buffers = False
            if (self.world > 2 and not getattr(model, "static_graph", False)
                    and not getattr(model, "find_unused_parameters", False)
                    and hasattr(getattr(model, "reducer", None), "_get_zeros_like_grad_buckets")):
                self._layouts = {}
        self._mem_init()
        self._inplace_init()
        if self.resume and self.ckpt_dir:
            _worker.trace_phase("worker.resume")
            if self._rejoin_ok and self._replacement:  # the survivors' state, else the node's snapshot
                if not self._heal():
                    self._resume()
            elif not (self._mem_dir and self._mem_resume()):  # the node's snapshot first, if as new
                self._resume()
            _worker.trace_phase("worker.resumed")
        if self._rejoin_ok and self._replacement:  # a replacement: the survivors' last collective
            self._collective(self._rejoin_sync)
        # where the state came from (rk run's relaunch incident names it): with checkpoints
        self.w.hello(self.step_no, restore=self.restored_from if self.ckpt_dir else None, rejoin=self._rejoin_ok)

    # ----------------------------------------------------------------- the loop

    def steps(self, total):
        """Yields the step to compute (steps applied so far) until `total` are applied; a
        redone step is yielded again, a rollback yields the replayed steps again. At the end
        it checkpoints (with a checkpoint directory) and says bye."""
        self._set_mode("steps")
        self._in_steps = True
        while True:
            try:
                self._between()
                if not self._boundary(self.step_no >= total):
                    continue  # rolled back: replay
                if self.step_no >= total:
                    self._finish()
                    return
            except _Rejoined:  # a peer died at the boundary: rejoined, at the restored step
                continue
            self._begin()
            yield self.step_no
            if self._attempt is not None:
                raise RuntimeError("rekindle.torch: the loop body must call job.step() once per step")

    def epochs(self, total):
        """Yields the epoch to run, from the resumed one to `total` - 1 (for `for epoch in
        range(total)`); the epoch's loop iterates job.batches(loader). At the end it
        checkpoints (with a checkpoint directory), verifies the replicas and says bye."""
        self._set_mode("epochs")
        self._in_steps = True
        while self._epoch_no < total:
            self._epoch_passes = 0
            yield self._epoch_no
            if self._attempt is not None:
                self._usage(f"epoch {self._epoch_no} ended in the middle of step {self.step_no} (no job.step() "
                            "after its last micro-batch): an epoch must hold whole steps")
            self._epoch_no += 1
            self._epoch_start = self.step_no
        while True:
            self._between()
            try:
                if not self._boundary(True):  # the last pass was verified: nothing to replay here
                    self._fail_guard(f"replica hashes differ after the last epoch (step {self.step_no})")
                break
            except _Rejoined:  # a peer died at the last boundary: healed at this step
                continue
        self._finish()

    def batches(self, loader):
        """`loader` (a DataLoader, workers and all, or any iterable of micro-batches) as the
        loop of one epoch iterates it, inside job.epochs: a redone step gets its micro-batches
        again, a rollback the steps' since the snapshot, a resume starts at the checkpoint's
        position in the epoch. See Batches."""
        return Batches(self, loader)

    def _set_mode(self, mode):
        if self._mode is not None and self._mode != mode:
            raise RuntimeError("rekindle.torch: a Job loops with job.steps() or with job.epochs(), not both")
        self._mode = mode

    def _finish(self):
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
        if self._attempt is None:
            raise RuntimeError("rekindle.torch: job.scale() outside a step: loop with job.steps(total), or "
                               "over job.batches(loader) inside job.epochs(n)")
        n = int(n)
        self._scaled += 1
        first = self._scaled == 1
        self._count = n if first else self._count + n
        self._factor = self.world * self._count / self.global_batch  # the rank's share, all micro-batches
        # world * n / global_batch; as a division where it is 1 / K (K micro-batches of equal
        # shares): the plain loop's `loss / accum`, bit for bit
        whole = self.world * n
        if n > 0 and self.global_batch % whole == 0:
            d = self.global_batch // whole
            out = loss if d == 1 else loss / d  # x / 1 is x: no graph node for it
        else:
            out = loss * (whole / self.global_batch)
        if self._nan:
            self._nan = False
            out = out * float("nan")
        # on the CPU the number itself (the hook reads it; a tensor would cost a detach and a
        # read), on a GPU a tensor (no wait for the device); summed over the micro-batches
        val = float(out) if out.device.type == "cpu" else out.detach()
        self._loss_t = val if first or self._loss_t is None else self._loss_t + val
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
            raise RuntimeError("rekindle.torch: job.step() outside a step: loop with job.steps(total), or over "
                               "job.batches(loader) inside job.epochs(n)")
        if self._broken is not None:  # a peer died in this step's all-reduce (the comm hook)
            self._rejoin(self._broken)
            return False
        if self._loss_t is None:
            raise RuntimeError("rekindle.torch: call job.scale(loss, n) on the loss before backward()")
        if self.accum is None:
            self.accum = self._scaled
            if self._skip_accum and self._skip_accum != self.accum:
                self._usage(f"the resume skipped {self._skipped} steps of the epoch as {self._skip_accum} "
                            f"micro-batches each, but a step here has {self.accum}: give the loader a batch_size "
                            "that is global_batch / (world x micro-batches a step)")
        elif self._scaled != self.accum:
            self._usage(f"step {self.step_no} had {self._scaled} micro-batches (job.scale calls), the steps "
                        f"before {self.accum}: every step must accumulate the same number")
        v = self._gathered()
        self._loss_t = None
        self._attempt = None
        world = self.world
        loss = v[_V_LOSS] / world
        norms = v[_V_NORMS:_V_NORMS + world]
        self._flags = v[_V_STOP:_V_NORMS]
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
            if not self._rolled_back:  # a rollback set the snapshot's states already
                self._redo()
            return False
        self.opt.step()
        self.step_no += 1
        self.loss = loss
        if math.isfinite(loss):
            losses = self._losses
            losses.append(loss)
            if len(losses) > _SPIKE_WINDOW:
                del losses[:-_SPIKE_WINDOW]
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
        self._last_step_s = time.monotonic() - self._t0
        self.w.step(self.step_no, loss, self._last_step_s)
        return True

    # ----------------------------------------------------------------- guards

    def _reduced_finite(self):
        """Whether the all-reduced gradients are finite (the hook's check per bucket: on the CPU
        a float32 sum, each element when that is not finite; on a GPU a float64 sum): a sum can
        be non-finite where every rank's own gradient was finite."""
        if self._red_bad:
            return False
        sums = self._redsums
        if not sums:
            return True
        self._redsums = []
        return math.isfinite(float(torch.stack(sums).sum()))

    def _judge(self, loss, norms, reduced=True):
        if reduced and self._suspect is None and math.isfinite(loss + sum(norms)):
            # every number finite (a NaN or an infinity anywhere makes the sum one), no rank
            # under suspicion: the outlier and spike tests alone
            if len(norms) > 1 and self._outliers(norms):
                return self._judge_full(loss, norms, reduced)
            if len(self._losses) < _SPIKE_WINDOW or not self._zscore(loss) > self.spike_z:
                return True
        return self._judge_full(loss, norms, reduced)

    def _judge_full(self, loss, norms, reduced=True):
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
                if self._spiked is not None:  # one redo a step: a spike again is kept
                    same = "the same loss" if self._spiked == bits else "a spike"
                    self._event("spike_kept", -1, "kept", 0,
                                f"loss {loss:.6g} (z {z:.1f}): {same} again on the redo: the data")
                    return True
                self._spiked = bits
                self._event("loss_spike", -1, "redo", 0,
                            f"loss {loss:.6g}, robust z-score {z:.1f}; step redone")
                return False
        return True

    def _outliers(self, norms):
        return grad_outliers(norms, self.grad_ratio)

    def _zscore(self, loss):
        return spike_zscore_over(self._losses, loss, self.spike_z)

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
        """The step is computed again: at the next attempt's start (after what the loop does
        after job.step(): a scheduler's step, a learning rate it sets) the RNG states, the
        buffers, the optimiser's hyperparameters and the scheduler go back to this attempt's
        start."""
        self._restore_next = {"rng": self._step_rng, "bufs": self._step_bufs, "groups": self._step_groups,
                              "sched": self._step_sched}

    def _between(self):
        """Before a step attempt's boundary: the learning-rate check, then what a redo or a
        rollback puts back."""
        if self.scheduler is None and not self._lr_manual and self._step_groups is not None:
            self._check_lr()
        r = self._restore_next
        if r is None:
            return
        self._restore_next = None
        self._put_back(r)

    def _put_back(self, r):
        """What a redo or a rollback puts back (_restore_next's): the RNG states, the buffers,
        the optimiser's hyperparameters, the scheduler."""
        self._restore_rng(r["rng"])
        if r.get("bufs"):
            with torch.no_grad():
                for b, saved in zip(self._buffers, r["bufs"]):
                    b.copy_(saved)
        if r.get("groups") is not None:
            for g, saved in zip(self.opt.param_groups, r["groups"]):
                g.update(saved)
        if r.get("sched") is not None and self.scheduler is not None:
            self.scheduler.load_state_dict(copy.deepcopy(r["sched"]))

    def _check_lr(self):
        """A learning rate that changed since the last attempt began, with no scheduler given to
        the Job: a scheduler the loop steps is then neither checkpointed nor rolled back, nor put
        back on a redo (it would advance on every redo, and a resumed run would start it from
        its beginning). Refused, naming it; a learning rate the script sets itself (no scheduler
        object) is saved with the optimiser's parameter groups and put back on a redo: fine."""
        for i, (g, old) in enumerate(zip(self.opt.param_groups, self._step_groups)):
            if g.get("lr") == old.get("lr"):
                continue
            sched = _find_scheduler(self.opt)
            if sched is None:
                self._lr_manual = True
                return
            self._usage(f"the learning rate of parameter group {i} changed from {old.get('lr'):.6g} to "
                        f"{g.get('lr'):.6g} at step {self.step_no}, stepped by a {type(sched).__name__} the Job "
                        "was not given: it would not be saved in checkpoints nor rolled back, so a resumed or "
                        "redone step would train with another learning rate; give it to the Job: "
                        "Job(..., scheduler=sched)")

    # ----------------------------------------------------------------- step boundary

    def _begin(self):
        if self._t0_step != self.step_no:
            self._t0, self._t0_step = time.monotonic(), self.step_no
        self._accepted = False
        self._attempt = self.step_no
        self._serial += 1
        self._fresh = False  # a redone attempt may have changed the state (a bit flip): verify again
        # numpy's and Python's too where the script draws from them between steps (seen at the
        # snapshot puts: _mem_step): a redo puts them back, the RNG slot holds them
        self._step_rng = self._capture_rng(cheap=not self._slot_more)
        # the loop may step a scheduler or set a learning rate after job.step(): a redo puts
        # them back
        self._step_groups = [{k: v for k, v in g.items() if k != "params"} for g in self.opt.param_groups]
        if self.scheduler is not None:
            self._step_sched = copy.deepcopy(self.scheduler.state_dict())
        # the forward updates buffers (BatchNorm's running statistics) before step() judges:
        # a redo puts them back (they are small)
        if self._buffers:
            self._step_bufs = [b.detach().clone() for b in self._buffers]
        if self._slot is not None:  # recovery in place: a replacement of this rank takes them
            self._slot_put()
        cmds = self.w.poll()
        if "stop" in cmds:
            self._stop_local = True
        self._local_ckpt = "checkpoint" in cmds
        self._hook_calls = 0
        self._backwards = 0
        self._deferred = None
        self._comm_sent = False
        self._redsums = []
        self._red_bad = False
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

    def _attempt_start(self):
        """job.batches: a step attempt begins (the loop asked for its first micro-batch)."""
        while True:
            self._between()
            try:
                if self._boundary(False):
                    break
            except _Rejoined:  # a peer died at the boundary: healed, the same step
                continue
        self._begin()

    def _epoch_pass(self, loader):
        """job.batches: the epoch's loop begins its pass over the loader. Returns (micro-batches
        to skip, whether the RNG draws of opening it and reading its first batch are to be
        undone): after a resume, the steps of the epoch done before it, and draws made before
        the checkpoint was written."""
        if self._mode != "epochs":
            self._usage("job.batches(loader) is iterated outside job.epochs(n): loop `for epoch in "
                        "job.epochs(n):` around it (it starts at the resumed epoch and ends the job)")
        if self._attempt is not None:
            self._usage(f"the loader was iterated again in the middle of step {self.step_no}")
        self._epoch_passes += 1
        if self._epoch_passes > 1:
            self._usage(f"job.batches(loader) was iterated twice in epoch {self._epoch_no}: one pass an epoch")
        self._epoch_snap = True
        if isinstance(loader, torch.utils.data.DataLoader) and loader.batch_size and not loader.drop_last:
            try:
                left = len(loader.sampler) % loader.batch_size
            except TypeError:
                left = 0
            if left:
                self._usage(f"the DataLoader's last batch of an epoch holds {left} samples, not batch_size "
                            f"{loader.batch_size}: that step's samples would not sum to global_batch "
                            f"{self.global_batch}; pass drop_last=True")
        skip, discard = 0, self._discard_rng
        self._discard_rng = False
        if self._skip_steps:
            k = self.accum or self._resume_accum or 1
            bs = getattr(loader, "batch_size", None)
            if isinstance(bs, int) and bs > 0 and self.global_batch % (self.world * bs) == 0:
                k = self.global_batch // (self.world * bs)
            skip, self._skip_accum, self._skipped = self._skip_steps * k, k, self._skip_steps
            self._skip_steps = 0
        return skip, discard

    def _epoch_end(self):
        """job.batches: the loader's epoch ended at a step boundary. The replicas are verified,
        so that no rollback reaches back into the epoch before; False after a rollback (steps of
        this epoch to replay)."""
        if self.guard and self.hash_every > 0:
            verified = self._fresh and self._snap is not None and self._snap["step"] == self.step_no
            try:
                if not verified and not self._replica_check():
                    return False
            except _Rejoined:  # a peer died in the check: healed at this step, check again
                return False
        return True

    def _replay_floor(self):
        """The oldest step a redo or a rollback can go back to."""
        if self.guard and self.hash_every > 0 and self._snap is not None:
            return min(self._snap["step"], self.step_no)
        return self.step_no

    def _boundary(self, final):
        """Between steps: the agreed commands, the replica check, checkpoints, the stop.
        False after a rollback (the loop replays)."""
        flags = self._flags
        stop, want_ckpt, lost, nosnap = flags[0] > 0, flags[1] > 0, flags[2] > 0, flags[3] > 0
        if lost:
            self._say("the supervisor is gone; stopping without a checkpoint")
            self._exit(EXIT_FAIL)
        if self._snap_asked is not None:  # every rank pinned it: they all took part in a step since
            if self.rank == 0:
                self.w.save(self._snap_asked, self.keep)
            self._snap_asked = None
        if nosnap and self._snap_save:  # agreed: a rank's snapshots went off
            self._snap_save = False
            want_ckpt = True  # the last one asked of rk run may be missing a rank's part
            if self.rank == 0:
                self._say(f"step {self.step_no}: rank 0 writes the checkpoints from here on (a rank's snapshots "
                          "are off, or there is no room for rk run to write them from the snapshots)")
        force, self._epoch_snap = self._epoch_snap, False
        save = bool(self.ckpt_dir) and self.step_no != self._saved_step and (
            stop or want_ckpt or final or (self.ckpt_every > 0 and self.step_no % self.ckpt_every == 0
                                           and self.step_no > self.start_step))
        # rk run writes it from the ranks' snapshots (RK_CKPT_FROM_SNAP): no rank waits for the disk
        by_run = save and self._snap_save
        verified = self._fresh and self._snap is not None and self._snap["step"] == self.step_no
        # an epoch's first step: a snapshot after the code between the epochs (a scheduler
        # stepped per epoch, the loader's new iterator), so that no rollback goes back past it
        if self.guard and self.hash_every > 0 and (not verified or force):
            if (save and not by_run) or stop or final:  # only a verified state is saved or handed back
                if not self._replica_check():
                    return False
            elif by_run or force or self._snap is None or self.step_no % self.hash_every == 0:
                # the hash rides in this step's all-reduce; step() compares them (and rk run
                # compares the snapshots' before it writes a checkpoint from them)
                if self._pending is None or self._pending["step"] != self.step_no:
                    self._pending = self._snapshot(hashed=True)
        if by_run:
            self._snap_ckpt(stop or final)
        elif save:
            self._save()
        if stop:
            if self.rank == 0:
                self._say(f"stopped on command at step {self.step_no}" +
                          (" with its checkpoint saved" if self.ckpt_dir else " (no checkpoint directory)"))
            self.w.bye(self.step_no, "stopped")
            self._barrier()
            self._exit(EXIT_STOPPED)
        if not final:
            self._mem_step(force=save)  # a snapshot in the node's memory when due, or of a checkpoint
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

    # ----------------------------------------------------------------- bucket layouts

    def _defers(self, bucket):
        """The comm hook, with 3 or more ranks: whether this bucket's backward is reduced later
        (reduce_in), in the layout the same backward of an uninterrupted run has. DDP reduces
        the run's first backward in its initial layout, then rebuilds its buckets (at the next
        forward) in the order the gradients became ready, and reduces every later backward so;
        the ring all-reduce adds an element's terms in an order set by its place in the
        buffer. A resumed process's first step comes before its DDP rebuilt: it is deferred,
        and DDP is made to rebuild from that backward's ready order (the same model and graph
        as the run's first: the same order). A step 0 redone or replayed comes after: it is
        deferred to the initial layout this process recorded in its first backward."""
        rebuilt = self._rebuilt or getattr(self.model, "_has_rebuilt_buckets", False)
        first = self._attempt == 0 and self._backwards == 0  # the run's first backward
        if bucket.is_last():
            self._backwards += 1
        if first and not rebuilt:  # DDP's initial layout: recorded
            seen = self._layouts.setdefault("seen", {})
            seen[bucket.index()] = bucket.parameters()
            if bucket.is_last() and len(seen) == bucket.index() + 1:
                self._layouts["initial"] = [seen[i] for i in range(len(seen))]
            return False
        if rebuilt != first or (first and "initial" not in self._layouts):
            return False  # the run's layout (or, never here, an initial one not recorded)
        if self._deferred is None:
            # at the end of this backward, after DDP's own end of it (which copies the buckets
            # into the gradients, and which DDP queues after its last bucket's hook): what the
            # loop does after backward() (clipping) sees the reduced gradients
            me = weakref.ref(self)
            queue = torch.autograd.Variable._execution_engine.queue_callback
            queue(lambda: queue(lambda: me() and me()._reduce_deferred()))
        self._deferred = "initial" if first else "rebuilt"
        return True

    def _reduce_deferred(self):
        """The deferred reduction of a backward (see _defers), as its backward ends: in the
        recorded initial layout, or in DDP's rebuilt one, which DDP is made to build now from
        that backward's ready order (rank 0's, broadcast)."""
        kind, self._deferred = self._deferred, None
        try:
            if kind == "initial":
                reduce_in(self, self._layouts["initial"])
            elif kind == "rebuilt":
                reducer = self.model.reducer
                reducer._rebuild_buckets()  # a broadcast of rank 0's bucket order
                self._rebuilt = True
                reduce_in(self, [b.parameters() for b in reducer._get_zeros_like_grad_buckets()])
        except RuntimeError as e:
            # a peer died in these collectives (the first backward after a resume or a
            # rejoin): under recovery in place the step's error, as the hook's (job.step()
            # rejoins); it raised out of the script's backward, and the rank ended as a
            # communication failure 10 s later (bench/RESULTS.md, a cascade of 22 s)
            if not getattr(self, "_rejoin_ok", False):
                raise
            self._broken = e
        return None

    # ----------------------------------------------------------------- collectives

    def _vector_len(self):
        return _V_NORMS + 5 * self.world

    def _vector(self, sumsq, dtype, device):
        """The step's vector (loss, count, flags, this rank's norm in its slot, the pending
        replica hash in 16-bit pieces in its slots): a list of floats on the CPU, a tensor of
        `dtype` on a GPU (no wait for the device)."""
        if self._count is None or self._loss_t is None:
            raise RuntimeError("rekindle.torch: call job.scale(loss, n) on the loss before backward()")
        factor = self._factor
        r = self.rank
        h = self._pending["hash"] if self._pending is not None else 0
        if self._vtail[0] != h:  # the same on every step without a pending hash
            world = self.world
            self._vtail = (h, [0.0] * (world - r - 1 + 4 * r) + [float((h >> (16 * i)) & 0xFFFF) for i in range(4)]
                           + [0.0] * (4 * (world - r - 1)))
        tail = self._vtail[1]
        if device.type == "cpu":  # Python numbers: no torch call per element
            norm = math.sqrt(float(sumsq)) / factor if factor > 0 else 0.0
            return ([float(self._loss_t), float(self._count), float(self._stop_local), float(self._local_ckpt),
                     float(self.w.lost), float(self._snap_save and (self._snap_short or not self._mem_put_ok))] + [0.0] * r + [norm] + tail)
        flags = [float(self._count), float(self._stop_local), float(self._local_ckpt), float(self.w.lost),
                 float(self._snap_save and (self._snap_short or not self._mem_put_ok))]
        head = torch.tensor(flags + [0.0] * r, dtype=dtype, device=device)
        norm = (sumsq.sqrt() / factor if factor > 0 else sumsq * 0).reshape(1).to(dtype)
        tail = torch.tensor(tail, dtype=dtype, device=device)
        lt = self._loss_t if torch.is_tensor(self._loss_t) else torch.tensor(self._loss_t)
        return torch.cat([lt.reshape(1).to(device=device, dtype=dtype), head, norm, tail])

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
            if isinstance(v, list):
                v = torch.tensor(v, dtype=torch.float64)
            if self.distributed and self.world > 1:
                self._comm()
                self._collective(dist.all_reduce, v)
            self._vec = v
        out = self._vec if isinstance(self._vec, list) else self._vec.to(torch.float64).cpu().tolist()
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
            if getattr(self, "_rejoin_ok", False) and self._rejoining:
                raise  # a peer failed during the rejoin: _rejoin waits for rk run's next command
            if getattr(self, "_rejoin_ok", False) and self._in_steps:
                self._rejoin(e)
                raise _Rejoined() from None
            self._comm_failed(e)

    def _barrier(self):
        if self.distributed and self.world > 1:
            self._collective(dist.barrier)

    # ----------------------------------------------------------------- replica hashes

    def _hashes(self):
        h = state_hash(self.module, self.opt, self._hash_buffers)
        mine = torch.tensor([h - (1 << 64) if h >= 1 << 63 else h], dtype=torch.int64, device=self.device)
        if not (self.distributed and self.world > 1):
            return [h]
        out = [torch.zeros_like(mine) for _ in range(self.world)]
        self._collective(dist.all_gather, out, mine)
        return [int(t) & 0xFFFFFFFFFFFFFFFF for t in out]  # as state_hash gives them: unsigned

    def _replica_check(self):
        """An explicit check (one all-gather): before a checkpoint, a stop and the end."""
        self._pending = None
        hashes = self._hashes()
        if all(h == hashes[0] for h in hashes):
            self._snap = self._snapshot()
            self._snap["hash"] = hashes[0]
            self._fresh = True
            return True
        self._repair(hashes)
        return False

    def _repair(self, hashes, pending=None):
        """Replica hashes differ: every rank returns to the last verified snapshot (none yet:
        the state of this step's start, `pending`), a copy that still has the verified hash is
        broadcast (the majority's, when nothing was verified yet), the steps since are
        replayed. A rank's snapshot whose hash changed in memory since it was verified is
        never the copy sent."""
        root, minority, strict = replica_vote(hashes)
        blame = minority[0] if strict and len(minority) == 1 else -1
        snap = self._snap if self._snap is not None else pending
        at = self.step_no
        lost = at - snap["step"] if snap is not None else 0
        if snap is not None:
            self._restore(snap)
        restored = self._hashes()  # each rank's copy of the snapshot, as it is now
        want = snap.get("hash") if snap is not None and snap is self._snap else None
        good = [r for r, h in enumerate(restored) if want is None or h == want]
        if not good:
            self._fail_guard(f"replica hashes differ at step {at} and no rank's snapshot of step "
                             f"{snap['step']} still has its verified hash: nothing to repair from")
        damaged = [r for r in range(len(restored)) if r not in good]
        src = max(good, key=lambda r: (restored.count(restored[r]), -r))
        self._broadcast_state(src)
        again = self._hashes()
        if any(h != again[0] for h in again):
            self._fail_guard("replica hashes still differ after the repair from the majority")
        self._snap = self._snapshot()
        self._snap["hash"] = again[0]
        self._fresh = True
        if len(hashes) == 2:  # which one is wrong cannot be told
            what = "replica hashes of ranks 0 and 1 differ (no majority: rank 0's copy kept)"
        elif not strict:
            what = f"replica hashes differ with no majority (rank {root}'s copy kept)"
        else:
            what = f"replica hash of rank(s) {','.join(str(r) for r in minority)} differs"
        if damaged:
            what += (f"; the snapshot of rank(s) {','.join(str(r) for r in damaged)} changed in "
                     "memory since it was verified")
        self._event("replica_mismatch", blame, "rollback", lost,
                    f"{what}; back to the verified state of step {self.step_no}, rank {src}'s copy "
                    f"broadcast, {lost} steps replayed", step=at)

    def _broadcast_state(self, root):
        if not (self.distributed and self.world > 1):
            return
        with torch.no_grad():
            for t in list(self.module.state_dict().values()) + _optim_tensors(self.opt):
                self._collective(dist.broadcast, t, root)

    def _snapshot(self, hashed=False):
        """A copy of the state to return to; `hashed`: with its replica hash (state_hash of
        the state now)."""
        sd = self.module.state_dict()
        state = {}
        keys = list(sd)
        tensors = list(sd.values())
        slots = []  # (param index, key) of the optimiser's tensors, in _optim_tensors' order
        ostate = self.opt.state
        i = 0
        for group in self.opt.param_groups:  # the order of _param_names, without the names
            for p in group["params"]:
                st = ostate.get(p)
                if st:
                    state[i] = {}
                    for k in sorted(st):
                        v = st[k]
                        if torch.is_tensor(v):
                            slots.append((i, k))
                            tensors.append(v)
                        else:
                            state[i][k] = copy.deepcopy(v)
                i += 1
        copies = [t.detach().clone() for t in tensors]
        for (i, k), v in zip(slots, copies[len(keys):]):
            state[i][k] = v
        snap = {
            "step": self.step_no,
            "model": dict(zip(keys, copies)),
            "optim": state,
            "groups": [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
                       for g in self.opt.param_groups],
            "rng": self._capture_rng(),
            "losses": list(self._losses),
            "sched": copy.deepcopy(self.scheduler.state_dict()) if self.scheduler is not None else None,
        }
        if hashed:  # state_hash, from the state dict already taken where it covers the buffers
            snap["hash"] = _hash_tensors(tensors) if self._hash_buffers else \
                state_hash(self.module, self.opt, False)
        return snap

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
        # and again at the next attempt's start, after what the loop does after job.step()
        self._restore_next = {"rng": snap["rng"], "groups": snap["groups"], "sched": snap.get("sched")}
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
        _end_daemons()
        os._exit(status)

    def _usage(self, msg):
        self._say(msg)
        self.w.exit_event(self.step_no, "usage", msg)
        self._exit(EXIT_USAGE)

    def _storage(self, msg):
        self._say(msg)
        self.w.exit_event(self.step_no, "storage", msg)
        self._exit(EXIT_STORAGE)

    def _ckpt_refused(self, msg):
        """The store refused the checkpoint by its own rule (the parameters or the optimiser
        state hold a NaN or an infinity): the job's numbers, not a device's fault. Exit 5 with
        a `ckpt_refused` exit event, which rk run counts against no device (docs/protocol.md)."""
        self._say(msg)
        self.w.exit_event(self.step_no, "ckpt_refused", msg)
        self._exit(EXIT_GUARD)

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
