#!/usr/bin/env python3
"""Runs a PyTorch training script with the two hooks bench/pytorch_vs_torchrun.py needs, the
same on both sides (torchrun and rk run):

    pytorch_hooks.py SCRIPT [ARGS...]

- the process group's timeout: `torch.distributed.init_process_group` gets
  `timeout=RK_BENCH_PG_TIMEOUT` seconds (default 60) when the script passes none (torch's
  default is 30 minutes; torchrun notices a hung rank only through it);
- one line `bench-step N t=UNIX_TIME` on stdout after every optimiser step of rank 0 (RANK,
  else OMPI_COMM_WORLD_RANK, else 0): N counts the steps this process applied (a step a guard
  redoes does not call the optimiser; a resumed process counts from 1 again).

- with RK_BENCH_PIN=1, the process pins itself to CPU LOCAL_RANK (modulo the CPUs it may use)
  before the script starts: on both sides alike, so that neither loses time to ranks moving
  between cores.

Then SCRIPT runs as `python3 SCRIPT ARGS...` would run it (runpy, as __main__).
"""

import datetime
import os
import runpy
import sys
import time

import torch
import torch.distributed as dist


def main():
    if len(sys.argv) < 2:
        print("usage: pytorch_hooks.py SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    timeout = datetime.timedelta(seconds=float(os.environ.get("RK_BENCH_PG_TIMEOUT", "60")))
    init = dist.init_process_group

    def init_process_group(*a, **kw):
        kw.setdefault("timeout", timeout)
        return init(*a, **kw)

    dist.init_process_group = init_process_group

    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    if os.environ.get("RK_BENCH_PIN") == "1":
        cpus = sorted(os.sched_getaffinity(0))
        local = int(os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")))
        os.sched_setaffinity(0, {cpus[local % len(cpus)]})
    if rank == 0:
        opt_init = torch.optim.Optimizer.__init__
        count = [0]
        patched = set()

        def optimizer_init(self, *a, **kw):
            opt_init(self, *a, **kw)
            cls = type(self)
            if cls in patched:
                return
            patched.add(cls)
            step = cls.step  # wrapped on the class: no reference to an optimiser is kept

            def counted_step(opt, *sa, **skw):
                r = step(opt, *sa, **skw)
                count[0] += 1
                sys.stdout.write(f"bench-step {count[0]} t={time.time():.6f}\n")
                sys.stdout.flush()
                return r

            cls.step = counted_step

        torch.optim.Optimizer.__init__ = optimizer_init

    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
