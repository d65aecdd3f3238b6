#!/usr/bin/env python3
"""A character-level transformer trained on the GPL-3 text with PyTorch DDP, written the way
training scripts usually are: an epoch loop over a DataLoader with a DistributedSampler,
workers, pinned memory and persistent workers; gradient accumulation with no_sync; AdamW with
weight decay and a warm-up + cosine LambdaLR stepped in the loop; clipping; bf16 autocast;
dropout and a causal mask buffer of -inf.

Plain DDP, the "before" of docs/pytorch.md (train_chars.py is it ported to rekindle).
Runs under torchrun or alone (a group of one); deterministic on CPU with OMP_NUM_THREADS=1.
"""
import argparse
import contextlib
import json
import math
import os
import socket

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import xxhash
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Chars(Dataset):
    """Windows of `block` + 1 characters of a text, `stride` apart: (input, the next characters);
    a multiple of `whole` of them (every step a full global batch)."""

    def __init__(self, text, block, stride, whole):
        self.chars = sorted(set(text))
        index = {c: i for i, c in enumerate(self.chars)}
        self.data = torch.tensor([index[c] for c in text], dtype=torch.long)
        self.block, self.stride = block, stride
        self.n = (len(self.data) - block - 1) // stride + 1
        self.n -= self.n % whole

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        w = self.data[i * self.stride:i * self.stride + self.block + 1]
        return w[:-1], w[1:]


class Attention(nn.Module):
    def __init__(self, dim, heads, block, dropout):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)
        self.register_buffer("mask", torch.full((block, block), float("-inf")).triu(1))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5 + self.mask[:t, :t]
        att = self.drop(att.float().softmax(-1)).to(v.dtype)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, dim, heads, block, dropout):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, block, dropout)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    def __init__(self, vocab, block, dim=64, heads=4, layers=2, dropout=0.1):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(block, dim))
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[Block(dim, heads, block, dropout) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        x = self.drop(self.tok(idx) + self.pos[:idx.size(1)])
        return self.head(self.ln(self.blocks(x)))


def params_hash(model):
    """xxh64 of every tensor of the state dict, in its order: equal hashes, equal weights."""
    h = xxhash.xxh64()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    p.add_argument("--block", type=int, default=32, help="context length in characters")
    p.add_argument("--stride", type=int, default=16, help="characters between two samples' starts")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=32, help="global batch: samples an optimiser step, all ranks")
    p.add_argument("--accum", type=int, default=2, help="micro-batches an optimiser step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--amp", choices=["bf16", "off"], default="bf16")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--result", help="write the parameters hash to this JSON file")
    args = p.parse_args()

    torch.manual_seed(args.seed)
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)  # alone: a group of one
    if os.environ["WORLD_SIZE"] == "1":
        os.environ.setdefault("MASTER_PORT", free_port())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    micro = args.batch // (world * args.accum)
    if micro * world * args.accum != args.batch:
        raise SystemExit(f"--batch {args.batch} does not split into {args.accum} micro-batches on {world} ranks")

    with open(args.text, encoding="utf-8") as f:
        ds = Chars(f.read(), args.block, args.stride, args.batch)
    sampler = DistributedSampler(ds, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(ds, batch_size=micro, sampler=sampler, num_workers=args.workers, pin_memory=True,
                        persistent_workers=args.workers > 0, drop_last=True)
    model = DDP(CharTransformer(len(ds.chars), args.block))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    total = args.epochs * (len(loader) // args.accum)

    def lr_at(step):  # linear warm-up, then cosine down to a tenth
        if step < args.warmup:
            return (step + 1) / args.warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - args.warmup) / max(1, total - args.warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp == "bf16")

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % args.accum == 0
            with model.no_sync() if not last else contextlib.nullcontext():
                with amp:
                    logits = model(x)
                loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
                (loss / args.accum).backward()
            if last:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                if rank == 0 and step % 50 == 0:
                    print(f"epoch {epoch} step {step} loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.2e}",
                          flush=True)

    digest = params_hash(model.module)
    if rank == 0:
        print(f"final params xxh64 {digest}", flush=True)
        if args.result:
            with open(args.result, "w") as f:
                json.dump({"hash": digest, "world": world}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
