"""A step's batch as a function of the step: what makes a resume, a redo and a replay exact.

A guard's redo runs the loop body again on the same step and a rollback yields the steps
since the snapshot again, so the batch of step s must be a function of s (never "the next
batch" of an iterator that only goes forward). The checkpoint's cursor counts the epoch's
global samples consumed (steps x global_batch), not this rank's.
"""

import numpy as np
import torch


def batch_indices(step, data_size, global_batch, seed=0, rank=0, world=1):
    """This rank's share of global batch `step` (an int64 tensor of sample indices): a seeded
    permutation of the data per epoch (data_size // global_batch steps), cut in global
    batches, each split in contiguous slices over the ranks (the first global_batch % world
    ranks get one sample more). The shares of the ranks sum to global_batch on every step,
    whatever the world size."""
    per_epoch = data_size // global_batch
    if per_epoch < 1:
        raise ValueError(f"data_size {data_size} is smaller than global_batch {global_batch}")
    epoch, k = divmod(int(step), per_epoch)
    idx = _permutation(data_size, seed, epoch)[k * global_batch:(k + 1) * global_batch]
    lo = rank * (global_batch // world) + min(rank, global_batch % world)
    return torch.from_numpy(idx[lo:lo + global_batch // world + (rank < global_batch % world)].copy())


_PERM = [None, None]  # the last epoch's (data_size, seed, epoch) and its permutation


def _permutation(data_size, seed, epoch):
    """The epoch's seeded permutation of the data, drawn once per (data_size, seed, epoch):
    drawing 60,000 again at every step cost 1.1 ms of a 4.8 ms step. Read-only: the caller
    copies its slice."""
    key = (data_size, seed, epoch)
    try:
        if _PERM[0] == key:
            return _PERM[1]
    except (TypeError, ValueError):  # a seed that compares oddly (an array): no cache
        return np.random.default_rng([seed, epoch]).permutation(data_size)
    perm = np.random.default_rng([seed, epoch]).permutation(data_size)
    perm.flags.writeable = False
    _PERM[:] = [key, perm]
    return perm


class StepBatches(torch.utils.data.Sampler):
    """A DataLoader batch sampler whose every batch is this rank's share of the job's current
    step (batch_indices of job.step_no), read when the loop asks for the batch: a redo or a
    replay gets the same samples again, a resume starts at the checkpoint's step. Use it
    through Job.loader, or as DataLoader(ds, batch_sampler=StepBatches(job, len(ds)),
    generator=torch.Generator()) with num_workers=0, one next() per step.

    Asked for a batch outside a step (a DataLoader with workers reads ahead of the loop) or
    twice in one step attempt (gradient accumulation), it would serve the same step's samples
    again: the job exits 2 (`usage`) naming the pattern."""

    def __init__(self, job, data_size, seed=0):
        super().__init__(None)
        self.job = job
        self.data_size = int(data_size)
        self.seed = seed

    def __iter__(self):
        job = self.job
        last = None
        while True:
            if job._attempt is None:
                job._usage("StepBatches was asked for a batch outside a step: a DataLoader with workers "
                           "(num_workers > 0) or a prefetch reads ahead of the loop, and every batch read "
                           f"ahead would be step {job.step_no}'s again; use num_workers=0 with StepBatches, or "
                           "iterate your own DataLoader (workers and all) with job.batches(loader) in job.epochs(n)")
            if job._serial == last:
                job._usage(f"StepBatches was asked for a second batch in step {job.step_no}: it serves one batch "
                           "a step (this rank's share of the step's global batch), so gradient accumulation "
                           "would train on the same samples again; for micro-batches iterate your own DataLoader "
                           "with job.batches(loader) in job.epochs(n), or cut the step's batch_indices yourself")
            last = job._serial
            yield batch_indices(job.step_no, self.data_size, job.global_batch, self.seed, job.rank,
                                job.world).tolist()


_END = object()


class _Skip:
    """A sampler that leaves out the first `n` indices of `orig` once: a BatchSampler's
    sampler while a resumed epoch's first pass opens (then the original again), so that the
    steps done before the checkpoint are not read at all."""

    def __init__(self, owner, orig, n):
        self.owner, self.orig, self.n = owner, orig, n

    def __iter__(self):
        self.owner.sampler = self.orig  # one pass only
        it = iter(self.orig)
        for _ in range(self.n):
            if next(it, _END) is _END:
                break
        return it

    def __len__(self):
        return len(self.orig)


def _open(loader, skip):
    """iter(loader), its first `skip` micro-batches left out: as indices for a DataLoader with
    a BatchSampler (nothing read), by reading them otherwise."""
    bs = getattr(loader, "batch_sampler", None)
    if skip and isinstance(loader, torch.utils.data.DataLoader) and isinstance(bs, torch.utils.data.BatchSampler) \
            and getattr(bs, "sampler", None) is not None:
        bs.sampler = _Skip(bs, bs.sampler, skip * bs.batch_size)
        return iter(loader)
    it = iter(loader)
    for _ in range(skip):
        if next(it, _END) is _END:
            break
    return it


class Batches:
    """A loader (a DataLoader, with workers, pinned memory and persistent workers, or any
    iterable of micro-batches) as one epoch's loop iterates it under a Job (job.batches):

    - every pass opens the loader once, as the plain loop does (its sampler's epoch, its
      RNG draws), and yields its micro-batches; the step's attempt begins with its first
      micro-batch (the Job's step boundary: commands, checkpoints, snapshots), and ends at
      job.step();
    - a step the guards reject yields the same micro-batches again, and after a rollback the
      steps since the snapshot are yielded again: the micro-batches read since the last
      verified snapshot are kept (references, no copy: do not change a batch in place);
    - at the loader's end (a step boundary) the replicas are verified, so a rollback never
      reaches back into an earlier epoch; an epoch's end in the middle of a step is refused;
    - after a resume the resumed epoch's pass leaves out the steps done before the checkpoint
      (as indices, without reading them, for a DataLoader with a batch_size), and undoes the
      RNG draws of opening the loader (they were made before the checkpoint).
    """

    def __init__(self, job, loader):
        self.job = job
        self.loader = loader
        self._done = {}  # step -> the micro-batches its attempts read (attempts that ended)
        self._checked = False  # len(loader) against the micro-batches a step

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        job = self.job
        skip, discard = job._epoch_pass(self.loader)
        rng = job._capture_rng() if discard else None
        it = _open(self.loader, skip)
        look = _END  # a micro-batch read ahead of its step's attempt
        if rng is not None:
            look = next(it, _END)  # the iterator's first read, its draws included, came before the checkpoint
            job._restore_rng(rng)
        self._done.clear()  # a rollback never reaches back into an epoch before
        serial, step, cur, k = None, None, None, 0
        while True:
            if job._attempt is None or job._serial != serial:
                if serial is not None:
                    self._ended(step, cur, k)
                serial = None
                if job.step_no not in self._done:
                    if look is _END:
                        look = next(it, _END)
                    if look is _END:  # the loader's epoch ended, at a step boundary
                        if job._epoch_end():
                            return
                        continue  # rolled back: replay this epoch's steps since the snapshot
                job._attempt_start()  # the boundary (which may roll back) and the attempt's start
                serial, step, k = job._serial, job.step_no, 0
                for s in [s for s in self._done if s < job._replay_floor()]:
                    del self._done[s]
                cur = None if step in self._done else []
            else:
                k += 1
            if cur is None:  # a redo or a replay: the step's own micro-batches
                got = self._done[step]
                if k >= len(got):
                    job._usage(f"step {step} asked for {k + 1} micro-batches when redone, it had {len(got)}: the "
                               "loop must call job.step() after the same number of micro-batches every step")
                item = got[k]
            else:
                if look is _END:
                    look = next(it, _END)
                if look is _END:
                    job._usage(f"the loader's epoch ended after {k} micro-batches of step {step} with no job.step(): "
                               "an epoch must hold whole steps (len(loader) a multiple of the micro-batches a step)")
                item, look = look, _END
                cur.append(item)
            yield item

    def _ended(self, step, cur, k):
        """The attempt of `step` ended (job.step() was called) after k + 1 micro-batches."""
        job = self.job
        if cur is None:
            if k + 1 != len(self._done[step]):
                job._usage(f"step {step} was computed again with {k + 1} micro-batches, it had "
                           f"{len(self._done[step])}: call job.step() after the same number every step")
            return
        self._done[step] = cur
        if not self._checked:
            self._checked = True
            try:
                n = len(self.loader)
            except TypeError:
                return
            if n % len(cur):
                job._usage(f"an epoch of the loader holds {n} micro-batches, not a multiple of the {len(cur)} "
                           "a step: the last ones would be left over (a plain loop carries their gradients into "
                           "the next epoch's first step); make len(loader) a multiple of the accumulation")
