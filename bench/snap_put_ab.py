#!/usr/bin/env python3
"""A PyTorch job's snapshot put, before and after its two speed-ups, alternating in one run:

    /usr/bin/python3 bench/snap_put_ab.py [WIDTH=2048] [ROUNDS=6]

The state is an MLP of 4 square Linear layers of WIDTH and Adam's state (WIDTH 2048: 192 MiB).
"before" puts it as the store did before: every tensor's bytes copied into a new bytes object
(`tobytes`), and a new file for each generation (the dropped one unlinked); "now" as it does
today: the bytes are views of the tensors' memory (rekindle.torch._state._raw), and the put
writes over the generation it drops (rekindle.snap). Both go through rekindle.snap.put's
checks, hashes and rename into a tmpfs (/dev/shm). Prints each side's median and best time
and rate; the rounds alternate the order (ABBA...)."""
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from rekindle import ckpt, snap  # noqa: E402
from rekindle.torch import _state  # noqa: E402


def main():
    try:
        width = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
        rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    except ValueError:
        print("usage: snap_put_ab.py [WIDTH] [ROUNDS] (whole numbers)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Linear(width, width) for _ in range(4)])
    opt = torch.optim.Adam(net.parameters())
    net(torch.randn(4, width)).sum().backward()
    opt.step()
    tensors = [("model." + k, v) for k, v in net.state_dict().items()]
    for i, p in enumerate(net.parameters()):
        tensors += [(f"optim.{i}.{k}", v) for k, v in opt.state[p].items() if torch.is_tensor(v) and v.dim() > 0]
    nbytes = sum(v.numel() * v.element_size() for _, v in tensors)
    retain = snap._retain

    def old_retain(rfd, step, recycle=None):
        retain(rfd, step)  # deletes what it drops: the copy makes a new file
        return False

    d = tempfile.mkdtemp(prefix="rk-snap-ab.", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.chmod(d, 0o700)
    times = {"before": [], "now": []}
    step = 0
    try:
        for r in range(rounds):
            for side in ("before", "now") if r % 2 == 0 else ("now", "before"):
                snap._retain = old_retain if side == "before" else retain
                t0 = time.perf_counter()
                items = []
                for n, v in tensors:
                    raw = _state._raw(v)
                    items.append(ckpt.Item(n, "F32", tuple(v.shape), raw.tobytes() if side == "before" else raw))
                snap.put(d, 0, step, items, world_size=1)
                times[side].append(time.perf_counter() - t0)
                step += 1
    finally:
        snap._retain = retain
        shutil.rmtree(d, ignore_errors=True)
    print(f"snap_put_ab: {nbytes / 2**20:.0f} MiB a put, {rounds} rounds, load average {os.getloadavg()[0]:.1f}")
    for side, v in times.items():
        med = statistics.median(v)
        print(f"  {side}: median {med * 1e3:.0f} ms ({nbytes / med / 1e9:.2f} GB/s), best {min(v) * 1e3:.0f} ms")
    print(f"  before / now, medians: {statistics.median(times['before']) / statistics.median(times['now']):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
