#!/usr/bin/env python3
"""A PyTorch job as people write them, for tests/it_pytorch_heal.sh: an MLP with dropout (the
torch RNG drawn every step, seeded per rank), AdamW (state of its own), a warm-up scheduler the
loop steps after every job.step() whether the step was applied or not, BatchNorm (buffers the
forward changes) and a DataLoader over a synthetic data set. --np-draws: the loop also draws
from numpy's global RNG every step (a noise level).

Writes {"hash": params xxh64, "lr": the scheduler's last rate} to --result (rank 0)."""
import argparse
import json

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import rekindle.torch
from rekindle.torch import params_hash


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ckpt-every", type=int, default=20)
    ap.add_argument("--np-draws", action="store_true")
    ap.add_argument("--result")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1234)  # the same initial weights on every rank
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2048, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long() + 2 * (x[:, 4:8].sum(1) > 0).long()
    model = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 4))
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 25))
    torch.manual_seed(99 + rank)  # dropout masks differ between ranks
    np.random.seed(5 + rank)
    job = rekindle.torch.Job(ddp, opt, scheduler=sched, global_batch=args.batch, ckpt_every=args.ckpt_every,
                             hash_every=5, name="heal_mlp")
    data = job.loader(torch.utils.data.TensorDataset(x, y))
    for _ in job.steps(args.steps):
        xb, yb = next(data)
        if args.np_draws:
            xb = xb + float(np.random.normal(0, 0.01))
        opt.zero_grad()
        loss = job.scale(F.cross_entropy(ddp(xb), yb), len(xb))
        loss.backward()
        job.step()
        sched.step()
    digest = params_hash(model)
    if rank == 0:
        print(f"final step {args.steps} params xxh64 {digest} lr {sched.get_last_lr()[0]:.6g}", flush=True)
        if args.result:
            with open(args.result, "w") as f:
                json.dump({"hash": digest, "lr": sched.get_last_lr()[0]}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
