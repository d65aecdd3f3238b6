#!/usr/bin/env python3
"""The job of bench/snap_scale.py: an MLP of --layers square Linear layers of --width, Adam,
trained by a rekindle.torch Job on seeded random batches (a fresh batch every step), under
rk run. Prints one JSON line of rank 0 at the end: the parameter count and the bytes of the
model and the optimiser's state, which the bench compares with the snapshot memory rk run saw."""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import rekindle.torch
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=32, help="global batch")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    net = nn.Sequential(*[nn.Sequential(nn.Linear(args.width, args.width), nn.Tanh()) for _ in range(args.layers)])
    model = DDP(net)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    job = rekindle.torch.Job(model, opt, global_batch=args.batch, data_size=1 << 20, name="snap_scale",
                             ckpt_every=1000, hash_every=0, guard=False)
    gen = torch.Generator().manual_seed(7 + rank)
    for step in job.steps(args.steps):
        x = torch.randn(args.batch // world, args.width, generator=gen)
        opt.zero_grad()
        loss = job.scale((model(x) - x).pow(2).mean(), args.batch // world)
        loss.backward()
        job.step()
    if rank == 0:
        params = sum(t.numel() for t in net.parameters())
        opt_bytes = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                        if torch.is_tensor(v))
        print(json.dumps({"params": params, "model_bytes": params * 4, "opt_bytes": opt_bytes}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
