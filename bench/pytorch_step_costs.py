#!/usr/bin/env python3
"""What rekindle.torch's per-step pieces cost on one process (world 1, gloo, CPU), for the
example's CNN and for an MLP of a chosen size: the snapshot and the replica hash taken every
`hash_every` steps, the Worker's two heartbeat lines, and a whole step with the guards on
against plain DDP. Fixed costs show on the small model, costs that grow with the model on the
large one (docs/pytorch.md, "What they cost").

    bench/pytorch_step_costs.py [--hidden 2048] [--layers 3] [--reps 20]

Run it with a python3 that has torch, numpy and xxhash (Debian's /usr/bin/python3).

Timings on a shared machine spread by tens of percent; instruction counts do not. With
`--count SIDE --steps N` (SIDE plain, hash0 or hash10: plain DDP, the guards on without or with
the replica hash every 10 steps) it runs N steps of the CNN alone, and under
`valgrind --tool=callgrind --instr-atstart=no` it switches the count on after 10 warm-up
steps (callgrind_control) and off after the N: run it for two N and divide the difference of
the "Collected" totals by the difference of the N for the instructions a step.
"""

import argparse
import os
import socket
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(SRC, "python"))
sys.path.insert(0, os.path.join(SRC, "examples", "pytorch"))


def timed(f, reps):
    f()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t) / reps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=2048, help="width of the large MLP")
    ap.add_argument("--layers", type=int, default=3, help="hidden layers of the large MLP")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--count", choices=["plain", "hash0", "hash10"], help="run one side's steps (under callgrind)")
    ap.add_argument("--steps", type=int, default=20, help="steps of --count")
    ap.add_argument("--batch", type=int, default=32, help="the CNN's batch in --count (one rank's share)")
    a = ap.parse_args()
    for k in ("RK_HEARTBEAT", "RK_CKPT_DIR", "RK_INJECT", "RK_RESUME"):
        os.environ.pop(k, None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import rekindle
    import rekindle.torch as rkt
    import train_fashion_mnist as ex

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    if a.count:
        return count(a, torch, F, DDP, rkt, ex)
    print(f"torch {torch.__version__}, 1 thread, world 1 (gloo), {a.reps} repetitions each")
    print("| model | parameters | snapshot ms | replica hash ms | both, a step at hash_every 10 ms |"
          " step, plain DDP ms | step, guards on ms |")
    print("|---|---|---|---|---|---|---|")
    mlp = [torch.nn.Linear(784, a.hidden), torch.nn.ReLU()]
    for _ in range(a.layers - 1):
        mlp += [torch.nn.Linear(a.hidden, a.hidden), torch.nn.ReLU()]
    mlp += [torch.nn.Linear(a.hidden, 10)]
    for name, make, shape in (("example CNN", lambda: ex.Net(), (32, 1, 28, 28)),
                              (f"MLP {a.layers}x{a.hidden}", lambda: torch.nn.Sequential(torch.nn.Flatten(), *mlp),
                               (32, 1, 28, 28))):
        torch.manual_seed(1)
        x, y = torch.rand(*shape), torch.randint(0, 10, (shape[0],))
        res = []
        for guard in (None, True):
            model = DDP(make())
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            if guard is None:
                def step():
                    opt.zero_grad()
                    F.cross_entropy(model(x), y).backward()
                    opt.step()
                res.append(timed(step, a.reps))
                continue
            job = rkt.Job(model, opt, global_batch=shape[0], ckpt_every=0, hash_every=10, verbose=False)
            it = job.steps(10 ** 9)

            def jstep():
                next(it)
                opt.zero_grad()
                job.scale(F.cross_entropy(model(x), y), shape[0]).backward()
                job.step()
            res.append(timed(jstep, a.reps))
            snap = timed(job._snapshot, a.reps)
            hsh = timed(lambda: rkt.state_hash(job.module, opt, True), a.reps)
            n = sum(p.numel() for p in job.module.parameters())
        print(f"| {name} | {n:,} | {snap * 1e3:.3f} | {hsh * 1e3:.3f} | {(snap + hsh) / 10 * 1e3:.3f} | "
              f"{res[0] * 1e3:.3f} | {res[1] * 1e3:.3f} |")
    # the Worker's comm + step lines into a socket that reads and drops them
    d = tempfile.mkdtemp()
    path = os.path.join(d, "hb.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)

    def sink():
        c, _ = srv.accept()
        while c.recv(65536):
            pass
    threading.Thread(target=sink, daemon=True).start()
    os.environ["RK_HEARTBEAT"] = path
    w = rekindle.Worker(install_stacks=False)
    w.hello(0)
    k = [0]

    def lines():
        k[0] += 1
        w.comm(k[0])
        w.step(k[0] + 1, 0.123456789, 0.005)
    print(f"\nWorker comm + step lines: {timed(lines, 20000) * 1e6:.1f} us a step")
    dist.destroy_process_group()
    return 0


def count(a, torch, F, DDP, rkt, ex):
    """--count: a.steps steps of one side, the instruction count on for them alone."""
    import subprocess

    torch.manual_seed(1)
    n = a.batch
    x, y = torch.rand(n, 1, 28, 28), torch.randint(0, 10, (n,))
    model = DDP(ex.Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if a.count == "plain":
        def step():
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    else:
        job = rkt.Job(model, opt, global_batch=n, ckpt_every=0, hash_every=int(a.count[4:]), verbose=False)
        it = job.steps(10 ** 9)

        def step():
            next(it)
            opt.zero_grad()
            job.scale(F.cross_entropy(model(x), y), n).backward()
            job.step()
    for _ in range(10):
        step()
    def toggle(on):
        try:  # outside valgrind callgrind_control finds no such process: nothing happens
            subprocess.run(["callgrind_control", "-i", on, str(os.getpid())], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        except OSError:
            pass
    toggle("on")
    for _ in range(a.steps):
        step()
    toggle("off")
    return 0


if __name__ == "__main__":
    sys.exit(main())
