"""The DDP communication hook that carries the step's vector of loss, count, flags and norms."""

import math
import weakref

import torch
import torch.distributed  # noqa: F401  (the fallback when the Job is gone)

# A last bucket up to this many elements carries the step's vector in its own all-reduce (two
# copies of the bucket, each cheaper than a collective's latency); a larger one leaves the
# bucket in place and reduces the vector in a second, small all-reduce.
_FUSE_MAX = 1 << 18
# the most ranks whose step vector rides in the last bucket (with more, every element's ring
# sum would move: the vector has its own all-reduce); bench/pytorch_guard_ab.py's "vector" A/B
# raises it in its on-blocks to time that all-reduce
_FUSE_WORLD_MAX = 2
_SAME = (torch.float32, torch.float64)
_vector_norm = torch.linalg.vector_norm
_Future = torch._C.Future
_set_result = torch._C.Future.set_result


def guard_buffer_sync(state, ddp):
    """DDP's broadcast of the module buffers (BatchNorm's statistics) at each forward's start
    is a collective of its own, outside the communication hook: under recovery in place a peer
    that died there would raise out of the script's forward. This wraps it (an attribute of the
    DDP object, kept when a rejoin makes the object anew): the error is the step's `_broken`,
    the forward goes on with this rank's buffers, the hook skips the all-reduces and job.step()
    rejoins; without recovery in place it raises as before."""
    cls_sync = getattr(type(ddp), "_sync_module_buffers", None)
    if cls_sync is None:  # another torch's DDP: its broadcast is left as it is (it raises)
        return
    model = weakref.ref(ddp)  # the DDP object holds this function: no cycle through it

    def sync(authoritative_rank):
        job = state()
        if job is not None and job._broken is not None:
            return None  # a peer died in this step already
        try:
            return cls_sync(model(), authoritative_rank)
        except RuntimeError as e:
            if job is None or not job._rejoin_ok:
                raise
            job._broken = e
            return None

    ddp._sync_module_buffers = sync


def _comm_hook(state, bucket):
    """DDP communication hook: the `comm` heartbeat before the first bucket's all-reduce, the
    gradflip fault, each rank's gradient norm before the all-reduce, and (with the last
    bucket, or in its own all-reduce just before it) the step's vector of loss, sample count,
    command flags and norms: the guards and the command agreement add no collective with 1 or
    2 ranks and a small last bucket, one small all-reduce otherwise.

    With 3 or more ranks a bucket is reduced in the layout DDP gives it in the same backward of
    an uninterrupted run (the ring all-reduce's summation order depends on where an element
    sits): where this process's layout is another (a resumed process's first step, before
    DDP's rebuild; a replay of step 0 after it), the hook only defers, and the Job reduces the
    gradients in that run's layout (reduce_in) as the backward ends. With 3 or more ranks
    the step's vector is never appended to a bucket: a longer buffer moves the ring's chunk
    boundaries and so the sums of the elements near them (plain DDP's sums, kept). With 1 or 2
    ranks every element is one sum of at most two numbers, the same in any layout.

    On the CPU the scalars are Python floats (no tensor per number): this hook runs every
    step and its fixed cost is what a small model pays."""
    buf = bucket.buffer()
    job = state()  # a weak reference to the Job
    if job is None:  # the Job is gone, the model trains on: DDP's own averaging
        pg = torch.distributed.distributed_c10d._get_default_group()
        buf.mul_(1.0 / pg.size())
        return pg.allreduce([buf]).get_future().then(lambda f: f.value()[0])
    if job._broken is not None:  # a peer died in this backward: the step is not applied (step())
        fut = _Future([])
        _set_result(fut, buf)
        return fut
    if job._hook_calls == 0:
        job._comm()
        if job._gradflip:
            job._gradflip = False
            job._flip_grad(buf)
    job._hook_calls += 1
    if job._layouts is not None and not isinstance(bucket, _Bucket) and job._defers(bucket):
        fut = _Future([])  # the local gradients as they are: reduced later, in the other layout
        _set_result(fut, buf)
        return fut
    world = job.world
    cpu = buf.device.type == "cpu"
    same = buf.dtype in _SAME
    if cpu and same:  # _add_sumsq's CPU path, inline: it runs every step
        sq = float(_vector_norm(buf)) ** 2
        if not math.isfinite(sq):
            sq = float(_vector_norm(buf, dtype=torch.float64).square())
        job._sumsq = sq if job._sumsq is None else job._sumsq + sq
    else:
        _add_sumsq(job, buf, cpu)
    last = bucket.is_last()
    n = buf.numel()
    fuse = last and same and n <= _FUSE_MAX and world <= _FUSE_WORLD_MAX
    if last and not fuse:
        # the vector on its own, as float64 (a half-precision bucket cannot hold the hash)
        vec = job._vector(job._sumsq, torch.float64, buf.device)
        if cpu:
            vec = torch.tensor(vec, dtype=torch.float64)
        # started now, waited for after the last bucket's: gloo runs the two rings at once
        vec_work = job._pg.allreduce([vec], job._ar_opts)
    # scaled as DDP's own reducer does, by the reciprocal (x * (1 / 3) is not always x / 3)
    if fuse:
        flat, head, tail, tail_np, _ = _scratch(job, bucket.index(), buf, n, fuse, cpu)
        torch.mul(buf, 1.0 / world, out=head)
        vec = job._vector(job._sumsq, buf.dtype, buf.device)
        if cpu:
            tail_np[:] = vec
        else:
            tail.copy_(vec)
    else:
        buf.mul_(1.0 / world)
        flat = head = buf

    # The reduced gradients go back to DDP as `head` itself (DDP copies the hook's result into
    # the gradients; copying it into the bucket first was one more pass).
    if last:
        # the rank's gradient norm is in the vector: a later backward of the same step (gradient
        # accumulation without no_sync all-reduces every micro-batch) starts its own sum
        job._sumsq = None
        # the last bucket: nothing left to overlap with, and a Python callback on the
        # future (a thread hop) costs more than the wait
        try:
            job._pg.allreduce([flat], job._ar_opts).wait()
            if not fuse:
                vec_work.wait()
        except RuntimeError as e:
            if not job._rejoin_ok:
                raise
            job._broken = e  # recovery in place: step() rejoins (_inplace.py), outside the backward
            fut = _Future([])
            _set_result(fut, head)
            return fut
        if fuse:
            job._vec = tail_np.tolist() if cpu else tail.clone()
        else:
            job._vec = vec.tolist() if cpu else vec
        if job.guard:  # one pass over the reduced bucket: is its sum finite (step() asks)
            if cpu and not math.isfinite(float(head.sum())):
                _add_redsum(job, head, cpu)
            elif not cpu:
                job._redsums.append(head.sum(dtype=torch.float64))
        fut = _Future([])  # torch.futures.Future without its Python layer
        _set_result(fut, head)
        return fut

    def done(f):
        try:
            f.value()
        except RuntimeError as e:
            if not job._rejoin_ok:
                raise
            job._broken = e  # recovery in place: step() rejoins (_inplace.py)
            return head
        if job.guard:
            _add_redsum(job, head, cpu)
        return head

    return job._pg.allreduce([flat], job._ar_opts).get_future().then(done)


def _add_sumsq(job, buf, cpu):
    """The rank's squared gradient norm, summed over the buckets: a Python float on the CPU (the
    bucket's norm in its own precision, squared: one pass, 1.9 ms for 10 M floats on one core
    where a float32 dot product took 4.4; again in float64 when it is not finite, which
    overflow alone can make it, so a large finite gradient is not taken for an infinite one;
    a NaN or an infinity stays one), a float64 tensor on a GPU (no wait for the device)."""
    if cpu and buf.dtype in (torch.float32, torch.float64):
        sq = float(torch.linalg.vector_norm(buf)) ** 2
        if not math.isfinite(sq):
            sq = float(torch.linalg.vector_norm(buf, dtype=torch.float64).square())
        job._sumsq = sq if job._sumsq is None else job._sumsq + sq
        return
    sq = torch.linalg.vector_norm(buf.detach(), dtype=torch.float64).square()
    if cpu:
        sq = float(sq)
    job._sumsq = sq if job._sumsq is None else job._sumsq + sq


def _add_redsum(job, head, cpu):
    """Records whether the reduced bucket is finite: on the CPU at once (its float32 sum; an
    element check when the sum is not finite, which overflow alone can cause), on a GPU as a
    float64 sum that step() reads with the vector."""
    if cpu:
        if not math.isfinite(float(head.sum())) and not bool(torch.isfinite(head).all()):
            job._red_bad = True
        return
    job._redsums.append(head.sum(dtype=torch.float64))


def _scratch(job, index, buf, n, fuse, cpu):
    """The bucket's reusable all-reduce buffer: (flat, head, tail, tail as numpy on the CPU),
    head the n gradient elements and tail the step's vector (fused into the last bucket;
    empty otherwise)."""
    s = job._scratch.get(index)
    if s is None or s[4] != (n, fuse, buf.dtype, buf.device):
        flat = torch.empty(n + (job._vector_len() if fuse else 0), dtype=buf.dtype, device=buf.device)
        s = (flat, flat[:n], flat[n:], flat[n:].numpy() if cpu else None, (n, fuse, buf.dtype, buf.device))
        job._scratch[index] = s
    return s


class _Bucket:
    """A bucket of another layout than DDP's now, as _comm_hook reads a GradBucket: its index,
    whether it is the last, its buffer (the gradients, flattened in order) and its parameters."""

    __slots__ = ("_index", "_last", "_buf", "_params")

    def __init__(self, index, last, buf, params):
        self._index, self._last, self._buf, self._params = index, last, buf, params

    def index(self):
        return self._index

    def is_last(self):
        return self._last

    def buffer(self):
        return self._buf

    def parameters(self):
        return self._params


def reduce_in(job, layout):
    """Reduces the gradients through _comm_hook in `layout` (each bucket's parameters, in
    DDP's bucket order), as DDP would have in that layout: each bucket's buffer holds the
    rank's (accumulated) gradients at the offsets DDP gives them, the hook scales and
    all-reduces it (the guards' numbers included) and the reduced gradients are copied back.
    One copy of the gradients in and one out."""
    ref = weakref.ref(job)
    pending = []
    for i, params in enumerate(layout):
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        buf = torch.cat([g.reshape(-1) for g in grads])
        pending.append((params, _comm_hook(ref, _Bucket(i, i == len(layout) - 1, buf, params))))
    for params, fut in pending:
        out = fut.wait()
        off = 0
        for p in params:
            k = p.numel()
            g = out[off:off + k].view_as(p)
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)
            off += k
