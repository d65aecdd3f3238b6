#!/usr/bin/env python3
"""What the step vector's own all-reduce costs a step with 3 or more ranks (docs/pytorch.md,
"Bucket layouts"): with 2 ranks rekindle.torch folds the step's vector (loss, flags, norm,
hashes: a few float64) into DDP's last bucket; with 3 or more it reduces it in an all-reduce
of its own, so that gloo's ring adds the gradients' terms in plain DDP's order. This times
that extra call as the Job makes it (the process group's own allreduce, gloo, CPU) for a
vector of ELEMS float64 (default: the Job's length at that world, 5 + 5 x world) at each
world size asked, WORLD processes on this host, and prints
the median and the 90th percentile of REPS calls a rank (after 50 warm-up calls).

    /usr/bin/python3 bench/pytorch_small_allreduce.py [--worlds 2,3,4] [--elems N]
                                                      [--reps 2000] [--threads 1]

Divide the median by a step's time at the same world (the example's "steps/s" under rk run)
for the share of a step. Run it with a python3 that has torch (Debian's /usr/bin/python3).
"""

import argparse
import os
import socket
import statistics
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, port, elems, reps, threads, out):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    pg = dist.distributed_c10d._get_default_group()
    opts = dist.AllreduceOptions()
    v = torch.arange(elems, dtype=torch.float64) * (rank + 1) / 7.0
    for _ in range(50):
        pg.allreduce([v.clone()], opts).wait()
    times = []
    for _ in range(reps):
        x = v.clone()
        t = time.perf_counter()
        pg.allreduce([x], opts).wait()
        times.append(time.perf_counter() - t)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        times.sort()
        out.put((statistics.median(times), times[int(0.9 * len(times))]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="2,3,4")
    ap.add_argument("--elems", type=int, default=0)
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    try:
        worlds = [int(w) for w in a.worlds.split(",")]
    except ValueError:
        print(f"pytorch_small_allreduce: --worlds {a.worlds!r}: not a list of integers", file=sys.stderr)
        return 2
    if any(w < 2 or w > 16 for w in worlds) or a.elems < 0 or a.reps < 10:
        print("pytorch_small_allreduce: --worlds each 2..16, --elems >= 0, --reps >= 10", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    print(f"| world | elements | median us | p90 us | calls |")
    print(f"|---|---|---|---|---|")
    for w in worlds:
        elems = a.elems or 5 + 5 * w  # rekindle.torch's _vector_len
        q = ctx.Queue()
        port = free_port()
        ps = [ctx.Process(target=rank_main, args=(r, w, port, elems, a.reps, a.threads, q))
              for r in range(w)]
        for p in ps:
            p.start()
        med, p90 = q.get(timeout=600)
        for p in ps:
            p.join(60)
        print(f"| {w} | {elems} | {med * 1e6:.0f} | {p90 * 1e6:.0f} | {a.reps} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
