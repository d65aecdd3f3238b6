#!/usr/bin/env python3
"""A small plain DDP training script for bench/pytorch_vs_torchrun.py (the bench's fallback
when examples/pytorch/train_fashion_mnist.py is not there).

Deterministic CPU training with gloo: a small CNN on Fashion-MNIST (Debian's
dataset-fashion-mnist), global batch 64 split over the ranks, SGD with momentum. Every step
rank 0 prints `step N loss L t=UNIX_TIME`. Checkpoints (model, optimiser, step) every
--ckpt-every steps into --ckpt-dir (or RK_CKPT_DIR), written atomically by rank 0; a start
resumes from the checkpoint there (torchrun restarts and rk run relaunches alike).

Launchers: torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or rk run (RANK/WORLD_SIZE
or Open MPI's OMPI_COMM_WORLD_*; without MASTER_ADDR the process group meets in a file of
the launch in the checkpoint directory). Under rk run (RK_HEARTBEAT set) it speaks the
heartbeat protocol with examples/python_worker.py's Heartbeat class; --hash-every K compares
a hash of the parameters across ranks every K steps (a stand-in for the replica guard).
The process group's timeout is --pg-timeout seconds (default 60).
"""

import argparse
import datetime
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = "/usr/share/datasets/fashion-mnist"


def env_int(*names, default):
    for n in names:
        if n in os.environ:
            return int(os.environ[n])
    return default


def load_images(path):
    with gzip.open(path, "rb") as f:
        magic, n, rows, cols = struct.unpack(">IIII", f.read(16))
        if magic != 2051:
            raise SystemExit(f"{path}: not an idx3 image file")
        return np.frombuffer(f.read(n * rows * cols), dtype=np.uint8).reshape(n, 1, rows, cols)


def load_labels(path):
    with gzip.open(path, "rb") as f:
        magic, n = struct.unpack(">II", f.read(8))
        if magic != 2049:
            raise SystemExit(f"{path}: not an idx1 label file")
        return np.frombuffer(f.read(n), dtype=np.uint8).astype(np.int64)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.f1 = nn.Linear(32 * 7 * 7, 128)
        self.f2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.f2(F.relu(self.f1(x.flatten(1))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=64, help="global batch")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--ckpt-dir", default=os.environ.get("RK_CKPT_DIR"))
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--hash-every", type=int, default=0, help="0: off")
    ap.add_argument("--pg-timeout", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    rank = env_int("RANK", "OMPI_COMM_WORLD_RANK", default=0)
    world = env_int("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", default=1)
    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    timeout = datetime.timedelta(seconds=a.pg_timeout)
    if "MASTER_ADDR" in os.environ or not a.ckpt_dir:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    else:
        store = os.path.join(a.ckpt_dir, f"pg-{os.environ.get('RK_LAUNCH', '0')}-"
                             f"{os.path.basename(os.environ.get('RK_HEARTBEAT', 'x'))}")
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank,
                                world_size=world, timeout=timeout)

    torch.manual_seed(a.seed)
    model = nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    start = 0
    ck = os.path.join(a.ckpt_dir, "bench-ddp.pt") if a.ckpt_dir else None
    if ck and os.path.exists(ck):
        s = torch.load(ck)
        model.module.load_state_dict(s["model"])
        opt.load_state_dict(s["optim"])
        start = s["step"]

    hb = None
    if os.environ.get("RK_HEARTBEAT"):
        sys.path.insert(0, os.path.join(HERE, "..", "examples"))
        from python_worker import Heartbeat  # the protocol's reference client

        hb = Heartbeat(rank, world, "cpu", start)

    x = torch.from_numpy(load_images(f"{DATA}/train-images-idx3-ubyte.gz").copy())
    y = torch.from_numpy(load_labels(f"{DATA}/train-labels-idx1-ubyte.gz"))
    n = x.shape[0]
    local = a.batch // world
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(a.seed))

    def save(step):
        if rank != 0 or not ck or (hb and hb.lost):
            return
        t0 = time.monotonic()
        tmp = f"{ck}.tmp.{os.getpid()}"
        torch.save({"model": model.module.state_dict(), "optim": opt.state_dict(), "step": step},
                   tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, ck)
        if hb:
            hb.ckpt(step, time.monotonic() - t0)

    step = start
    while step < a.steps:
        t0 = time.monotonic()
        i = (step * a.batch + rank * local) % (n - local)
        idx = perm[i:i + local]
        xb = (x[idx].float() / 255.0 - 0.2860) / 0.3530
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), y[idx])
        loss.backward()
        opt.step()
        step += 1
        if a.hash_every and step % a.hash_every == 0:
            with torch.no_grad():
                h = torch.stack([p.double().sum() for p in model.parameters()]).sum().reshape(1)
            hs = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
            dist.all_gather(hs, h)
            if any(v.item() != h.item() for v in hs):
                print(f"step {step}: replica hashes differ", file=sys.stderr)
        lv = loss.item()
        if hb:
            hb.step(step, lv, time.monotonic() - t0)
        if rank == 0:
            print(f"step {step} loss {lv:.4f} t={time.time():.6f}", flush=True)
        if ck and step % a.ckpt_every == 0:
            save(step)
        if hb and hb.poll() == "stop":
            save(step)
            hb.bye(step, "stopped")
            return 4
    save(step)
    if hb:
        hb.bye(step, "done")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
