"""The DDP communication hook that carries the step's vector of loss, count, flags and norms."""

import torch


def _comm_hook(job, bucket):
    """DDP communication hook: the `comm` heartbeat before the first bucket's all-reduce, the
    gradflip fault, each rank's gradient norm before the all-reduce, and (with the last
    bucket) the step's vector of loss, sample count, command flags and norms, so the guards
    and the command agreement cost no collective of their own.

    The bucket is reduced in a canonical layout (parameters in model order, whatever order
    DDP put them in): DDP rebuilds its buckets after the first iteration in the order the
    gradients became ready, and with 3 or more ranks the ring all-reduce's summation order
    depends on where an element sits, so a resumed or replayed step would round differently
    from the same step of an uninterrupted run."""
    buf = bucket.buffer()
    if job._hook_calls == 0:
        job._comm()
        if job._gradflip:
            job._gradflip = False
            job._flip_grad(buf)
    job._hook_calls += 1
    sq = torch.linalg.vector_norm(buf.detach(), dtype=torch.float64).square()
    job._sumsq = sq if job._sumsq is None else job._sumsq + sq
    buf.div_(job.world)
    perm = _canonical(job, bucket, buf)
    last = bucket.is_last()
    same = buf.dtype in (torch.float32, torch.float64)
    pieces = [buf if perm is None else buf.index_select(0, perm)]
    if last and same:
        pieces.append(job._vector(job._sumsq, buf.dtype, buf.device))
    elif last:
        vec = job._vector(job._sumsq, torch.float64, buf.device)
        job._pg.allreduce([vec], job._ar_opts).wait()
        job._vec = vec
    n = pieces[0].numel()
    flat = torch.cat(pieces) if len(pieces) > 1 else pieces[0]

    def done(t):
        if last and same:
            job._vec = t[n:].clone()
        if job.guard:  # one pass over the reduced bucket: is its sum finite (step() asks)
            job._redsums.append(t[:n].sum(dtype=torch.float64))
        if perm is None:
            if t.data_ptr() != buf.data_ptr():
                buf.copy_(t[:n])
        else:
            buf.index_copy_(0, perm, t[:n])
        return buf

    if last:
        # the last bucket: nothing left to overlap with, and a Python callback on the
        # future (a thread hop) costs more than the wait
        job._pg.allreduce([flat], job._ar_opts).wait()
        fut = torch.futures.Future()
        fut.set_result(done(flat))
        return fut
    return job._pg.allreduce([flat], job._ar_opts).get_future().then(lambda f: done(f.value()[0]))


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
