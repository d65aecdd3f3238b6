"""The DDP communication hook that carries the step's vector of loss, count, flags and norms."""

import math

import torch
import torch.distributed  # noqa: F401  (the fallback when the Job is gone)

# A last bucket up to this many elements carries the step's vector in its own all-reduce (two
# copies of the bucket, each cheaper than a collective's latency); a larger one leaves the
# bucket in place and reduces the vector in a second, small all-reduce.
_FUSE_MAX = 1 << 18
_SAME = (torch.float32, torch.float64)
_vector_norm = torch.linalg.vector_norm
_Future = torch._C.Future
_set_result = torch._C.Future.set_result


def _comm_hook(state, bucket):
    """DDP communication hook: the `comm` heartbeat before the first bucket's all-reduce, the
    gradflip fault, each rank's gradient norm before the all-reduce, and (with the last
    bucket) the step's vector of loss, sample count, command flags and norms, so the guards
    and the command agreement cost no collective of their own.

    With 3 or more ranks the bucket is reduced in a canonical layout (parameters in model
    order, whatever order DDP put them in): DDP rebuilds its buckets after the first
    iteration in the order the gradients became ready, and the ring all-reduce's summation
    order depends on where an element sits, so a resumed or replayed step would round
    differently from the same step of an uninterrupted run. With 1 or 2 ranks every element
    is one sum of at most two numbers, the same in any layout: no permutation.

    On the CPU the scalars are Python floats (no tensor per number): this hook runs every
    step and its fixed cost is what a small model pays."""
    buf = bucket.buffer()
    job = state()  # a weak reference to the Job
    if job is None:  # the Job is gone, the model trains on: DDP's own averaging
        pg = torch.distributed.distributed_c10d._get_default_group()
        buf.div_(pg.size())
        return pg.allreduce([buf]).get_future().then(lambda f: f.value()[0])
    if job._hook_calls == 0:
        job._comm()
        if job._gradflip:
            job._gradflip = False
            job._flip_grad(buf)
    job._hook_calls += 1
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
    perm = _canonical(job, bucket, buf) if world > 2 else None
    last = bucket.is_last()
    n = buf.numel()
    fuse = last and same and n <= _FUSE_MAX
    if last and not fuse:
        # the vector on its own, as float64 (a half-precision bucket cannot hold the hash)
        vec = job._vector(job._sumsq, torch.float64, buf.device)
        if cpu:
            vec = torch.tensor(vec, dtype=torch.float64)
        job._pg.allreduce([vec], job._ar_opts).wait()
        job._vec = vec.tolist() if cpu else vec
    if fuse or perm is not None:
        flat, head, tail, tail_np, _ = _scratch(job, bucket.index(), buf, n, fuse, cpu)
        if perm is None:
            torch.div(buf, world, out=head)
        else:
            torch.index_select(buf, 0, perm, out=head)
            head.div_(world)
        if fuse:
            vec = job._vector(job._sumsq, buf.dtype, buf.device)
            if cpu:
                tail_np[:] = vec
            else:
                tail.copy_(vec)
    else:
        buf.div_(world)
        flat = head = buf

    # The reduced gradients go back to DDP as `head` itself where it is in the bucket's layout
    # (DDP copies the hook's result into the gradients; copying it into the bucket first
    # was one more pass), through the bucket where it was permuted.
    if last:
        # the rank's gradient norm is in the vector: a later backward of the same step (gradient
        # accumulation without no_sync all-reduces every micro-batch) starts its own sum
        job._sumsq = None
        # the last bucket: nothing left to overlap with, and a Python callback on the
        # future (a thread hop) costs more than the wait
        job._pg.allreduce([flat], job._ar_opts).wait()
        if fuse:
            job._vec = tail_np.tolist() if cpu else tail.clone()
        if job.guard:  # one pass over the reduced bucket: is its sum finite (step() asks)
            if cpu and not math.isfinite(float(head.sum())):
                _add_redsum(job, head, cpu)
            elif not cpu:
                job._redsums.append(head.sum(dtype=torch.float64))
        if perm is not None:
            head = buf.index_copy_(0, perm, head)
        fut = _Future([])  # torch.futures.Future without its Python layer
        _set_result(fut, head)
        return fut

    def done(t):
        if job.guard:
            _add_redsum(job, head, cpu)
        if perm is not None:
            return buf.index_copy_(0, perm, head)
        return head

    return job._pg.allreduce([flat], job._ar_opts).get_future().then(lambda f: done(f.value()[0]))


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


def _canonical(job, bucket, buf):
    """The index that puts the bucket's elements in model order (None: already so); cached
    per bucket layout."""
    params = bucket.parameters()
    key = (bucket.index(), tuple(id(p) for p in params))
    if key in job._perms:
        return job._perms[key]
    views = bucket.gradients()
    size = buf.element_size()
    spans = []
    for p, v in zip(params, views):
        off = (v.data_ptr() - buf.data_ptr()) // size
        spans.append((job._pindex.get(id(p), len(job._pindex)), off, v.numel()))
    order = sorted(spans)
    idx = torch.cat([torch.arange(off, off + k, dtype=torch.int64) for _, off, k in order]) if order else None
    if idx is not None and idx.numel() == buf.numel() and torch.equal(idx, torch.arange(buf.numel())):
        idx = None
    if idx is not None:
        idx = idx.to(buf.device)
    job._perms[key] = idx
    return idx
