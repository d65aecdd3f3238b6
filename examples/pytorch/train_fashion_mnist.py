#!/usr/bin/env python3
"""A small CNN on Fashion-MNIST with PyTorch DDP: gloo on CPU, NCCL with CUDA, the same file.

Ported to rekindle.torch (docs/pytorch.md; plain_ddp.py is the "before"): under `rk run` it is protected.
Runs under torchrun, `rk run --launcher local`, or alone (a group of one); deterministic on CPU.
"""
import argparse
import gzip
import json
import os
import socket
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import xxhash
import rekindle.torch
from torch.nn.parallel import DistributedDataParallel as DDP


def load_images(data, split, subset):
    """Fashion-MNIST from the Debian data set's idx files: (N, 1, 28, 28) floats, labels."""
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(os.path.join(data, f"{prefix}-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(data, f"{prefix}-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    if subset:
        x, y = x[:subset], y[:subset]
    return torch.from_numpy(x.astype(np.float32) / 255.0), torch.from_numpy(y.astype(np.int64))


class Net(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, stride=2)  # 28 -> 13
        self.conv2 = nn.Conv2d(width, 2 * width, 3, stride=2)  # 13 -> 6
        self.fc = nn.Linear(2 * width * 36, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.fc(x.flatten(1))


def params_hash(model):
    """xxh64 of every tensor of the state dict, in its order: equal hashes, equal weights."""
    h = xxhash.xxh64()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


_perm = [None, None]  # the epoch's (n, seed, epoch) and its permutation


def batch_indices(step, n, batch, seed, rank, world):
    """This rank's share of global batch `step`: a seeded permutation per epoch, split in
    contiguous slices (the first batch % world ranks get one sample more)."""
    per_epoch = n // batch
    epoch, k = divmod(step, per_epoch)
    if _perm[0] != (n, seed, epoch):  # drawn once an epoch, not at every step
        _perm[:] = [(n, seed, epoch), np.random.default_rng([seed, epoch]).permutation(n)]
    idx = _perm[1][k * batch:(k + 1) * batch]
    lo = rank * (batch // world) + min(rank, batch % world)
    return torch.from_numpy(idx[lo:lo + batch // world + (rank < batch % world)])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch", type=int, default=64, help="global batch, split over the ranks")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--subset", type=int, default=0, help="train on the first N samples (0: all)")
    p.add_argument("--data", default=os.environ.get("RK_FMNIST_DIR", "/usr/share/datasets/fashion-mnist"))
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--hash-every", type=int, default=10)
    p.add_argument("--guard", choices=["on", "off"], default="on")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--result", help="write the final step and parameters hash to this JSON file")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    # the data before the rank is asked for: in place, a warm spare reads it ahead of its rank
    # (docs/recovery.md, "The warm spare")
    x, y = load_images(args.data, "train", args.subset)
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)  # standalone: a group of one
    if os.environ["WORLD_SIZE"] == "1":
        os.environ.setdefault("MASTER_PORT", free_port())
    cuda = torch.cuda.is_available()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DDP(Net().to(device), device_ids=[device] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    job = rekindle.torch.Job(model, opt, global_batch=args.batch, data_size=len(x), name="fashion_mnist_cnn",
                             ckpt_every=args.ckpt_every, hash_every=args.hash_every, guard=args.guard == "on")
    t0, c0 = time.monotonic(), time.process_time()
    for step in job.steps(args.steps):
        idx = batch_indices(step, len(x), args.batch, args.seed, rank, world)
        xb, yb = x[idx].to(device), y[idx].to(device)
        opt.zero_grad()
        loss = job.scale(F.cross_entropy(model(xb), yb), len(idx))
        loss.backward()
        job.step()
        if rank == 0 and (step + 1) % 100 == 0:
            print(f"step {step + 1} loss {loss.item():.4f}", flush=True)

    digest = params_hash(model.module)
    if rank == 0:
        dt, cpu = time.monotonic() - t0, time.process_time() - c0
        ran = max(job.step_no - job.start_step, 1)  # this launch's steps: fewer after a resume
        print(f"train loop: {ran} steps in {dt:.3f} s ({ran / dt:.1f} steps/s, "
              f"{cpu / ran * 1e3:.3f} ms CPU a step on rank 0)", flush=True)
        print(f"final step {args.steps} params xxh64 {digest}", flush=True)
        if args.result:
            with open(args.result, "w") as f:
                json.dump({"step": args.steps, "hash": digest, "world": world}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
