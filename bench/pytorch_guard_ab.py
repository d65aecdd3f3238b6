#!/usr/bin/env python3
"""What the guards and the replica hash cost a step, measured inside one run, where a run's
own speed (on this 2-CPU virtual machine two runs of the same job differ by up to 40%, each
steady within itself) cancels out:

    bench/pytorch_guard_ab.py SCRIPT [ARGS...]     (as pytorch_hooks.py, under rk run or not)

The script's rekindle.torch.Job switches its guards on and off every --block steps (default:
the Job's checkpoint period, so that every block holds one checkpoint; RK_GUARD_AB_BLOCK
overrides), on every rank alike (the switch is a function of the step). Blocks alternate
off, on, off, on...; with the guards on a block also takes the replica hash every
`hash_every` steps and checks the replicas before its checkpoint, as a run with the guards on
does. Rank 0 times each block by its own clock and prints, at the end, one line

    guard-ab: blocks N on/off, median ratio R, mean ratio M, on-block median S steps/s, ...

where each on-block's ratio is its rate against the mean of the off-blocks on either side of
it (a slow spell of the machine falls on both). The first two blocks are warm-up and left out.
Run the script with its guards on (--guard on): the wrapper turns them off in the off-blocks.

With RK_GUARD_AB_WHAT=vector the guards stay on and what switches is where the step's vector
goes with 3 or more ranks: its own small all-reduce in the off-blocks (what the Job does),
folded into the last bucket in the on-blocks (what it does with 2 ranks; the sums differ in
the last bits, the cost is what is timed): a ratio above 1 is the share of a step the vector's
own all-reduce costs.
"""

import os
import runpy
import statistics
import sys
import time


def main():
    if len(sys.argv) < 2:
        print("usage: pytorch_guard_ab.py SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    import rekindle.torch as rt

    init, step = rt.Job.__init__, rt.Job.step
    marks = []  # (step_no at the block's start, time, guard of the block)
    state = {}

    from rekindle.torch import _hook
    what = os.environ.get("RK_GUARD_AB_WHAT", "guard")
    if what not in ("guard", "vector"):
        print(f"pytorch_guard_ab.py: RK_GUARD_AB_WHAT={what!r}: not guard or vector", file=sys.stderr)
        return 2
    vector = what == "vector"

    def switch(self, on):
        if vector:
            _hook._FUSE_WORLD_MAX = 1 << 30 if on else 2
        else:
            self.guard = on

    def job_init(self, *a, **kw):
        init(self, *a, **kw)
        state["block"] = int(os.environ.get("RK_GUARD_AB_BLOCK", "0")) or self.ckpt_every or 50
        state["want"] = True if vector else self.guard  # the script's setting: the on-blocks'
        switch(self, False)  # block 0: off
        marks.append((self.step_no, time.monotonic(), False))

    def job_step(self):
        applied = step(self)
        if applied and self.step_no % state["block"] == 0:
            on = (self.step_no // state["block"]) % 2 == 1 and state["want"]
            switch(self, on)
            marks.append((self.step_no, time.monotonic(), on))
        return applied

    rt.Job.__init__, rt.Job.step = job_init, job_step
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        report(marks, state)
    return 0


def report(marks, state):
    if os.environ.get("RANK", "0") != "0" or len(marks) < 6:
        return
    blocks = []  # (guard, steps/s)
    for (s0, t0, g), (s1, t1, _) in zip(marks, marks[1:]):
        if s1 > s0 and t1 > t0:
            blocks.append((g, (s1 - s0) / (t1 - t0)))
    blocks = blocks[2:]  # warm-up
    ratios = []
    for i in range(1, len(blocks) - 1):
        g, r = blocks[i]
        if g and not blocks[i - 1][0] and not blocks[i + 1][0]:
            ratios.append(r / ((blocks[i - 1][1] + blocks[i + 1][1]) / 2))
    on = [r for g, r in blocks if g]
    off = [r for g, r in blocks if not g]
    if not ratios:
        print("guard-ab: too few blocks", flush=True)
        return
    print(f"guard-ab: blocks {len(on)}/{len(off)} on/off of {state['block']} steps, median ratio "
          f"{statistics.median(ratios):.4f}, mean ratio {statistics.mean(ratios):.4f}, on-block median "
          f"{statistics.median(on):.2f} steps/s, off-block median {statistics.median(off):.2f} steps/s, "
          f"ratios {' '.join(f'{x:.3f}' for x in ratios)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
