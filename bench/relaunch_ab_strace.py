#!/usr/bin/env python3
"""relaunch_ab_strace: the phases of a relaunch for builds that have no launch trace (an older
main), measured the same way for each build: strace's timestamps of the system calls that
mark the phases, the same job, injected crashes at fixed steps, builds alternating.

    bench/relaunch_ab_strace.py NAME=BUILD_DIR [NAME=BUILD_DIR ...] [--rounds 2] [--crashes 4]

Each round runs, for each build in turn, `rk run -n 4` of bench/run_goodput's worker (rk train
cnn-small under mpirun) with `--inject crash@step=S:rank=R` at CRASHES fixed steps (200, 400,
...), under `strace -f -ttt --seccomp-bpf -e trace=execve,openat,connect` (only those calls
stop the processes). For each relaunch, from the failure seen (the crash event's `time`, the
realtime clock of strace's -ttt) to the resumed step (that time + recovery_s), the boundaries
are the last rank's: execve of mpirun; execve of `rk _rank-env`; execve of `rk train`;
openat of the training images (MPI_Init and the backend done); openat in the checkpoint
directory by rank 0, which reads it (the data read, the model built); connect to rk run's socket (the checkpoint read:
the hello). strace slows every process's start a little, the same for each build: compare
builds, not against the untraced numbers of bench/relaunch_breakdown.
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

LINE = re.compile(r"^(\d+)\s+(\d+\.\d+)\s+(execve|openat|connect)\((.*)$")


def parse_strace(path):
    ev = []
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if not m or re.search(r"= -1 [A-Z]", line):  # failed (an execvp's PATH search)
                continue
            ev.append((int(m.group(1)), float(m.group(2)), m.group(3), m.group(4)))
    return ev


def iso_to_epoch(s):
    import datetime
    return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def phases(ev, events, ckdir, ranks):
    crashes = [e for e in events if e.get("action") == "relaunch" and e.get("recovery_s") is not None]
    rows = []
    for c in crashes:
        t0 = iso_to_epoch(c["time"])
        t1 = t0 + c["recovery_s"]
        win = [e for e in ev if t0 <= e[1] <= t1]
        def last(pred, n):
            ts = {}
            for pid, t, call, args in win:
                if pred(call, args):
                    ts.setdefault(pid, t)
            return max(ts.values()) if len(ts) >= n else None
        b = [("failure seen", t0)]
        b.append(("mpirun exec", last(lambda c_, a: c_ == "execve" and '"mpirun"' in a.split(",")[1] if "," in a else False, 1)))
        b.append(("rk _rank-env exec", last(lambda c_, a: c_ == "execve" and '"_rank-env"' in a, ranks)))
        b.append(("rk train exec", last(lambda c_, a: c_ == "execve" and '"train"' in a and '"_rank-env"' not in a, ranks)))
        b.append(("data opened", last(lambda c_, a: c_ == "openat" and "train-images-idx3-ubyte" in a, ranks)))
        # rank 0 reads the checkpoint (the others receive it): one process
        b.append(("checkpoint opened", last(lambda c_, a: c_ == "openat" and ckdir in a, 1)))
        b.append(("hello (connect)", last(lambda c_, a: c_ == "connect" and "rk-run" in a, ranks)))
        b.append(("resumed step", t1))
        rows.append(b)
    return rows


def main():
    builds, rounds, crashes = [], 2, 4
    args = sys.argv[1:]
    while args:
        a = args.pop(0)
        if a == "--rounds":
            rounds = int(args.pop(0))
        elif a == "--crashes":
            crashes = int(args.pop(0))
        elif "=" in a:
            n, d = a.split("=", 1)
            builds.append((n, os.path.abspath(d)))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    if not builds:
        print(__doc__, file=sys.stderr)
        return 2
    env = dict(os.environ, OMPI_MCA_btl="self,vader", OMPI_MCA_btl_vader_single_copy_mechanism="none")
    tmp = tempfile.mkdtemp(prefix="rlab.")
    spec = ",".join(f"crash@step={200 * (i + 1)}:rank={1 + i % 3}" for i in range(crashes))
    rows = {n: [] for n, _ in builds}
    rec = {n: [] for n, _ in builds}
    for r in range(rounds):
        order = builds if r % 2 == 0 else builds[::-1]
        for n, d in order:
            rk = os.path.join(d, "rk")
            base = os.path.join(tmp, f"{n}.{r}")
            ck = base + ".ck"
            cmd = ["strace", "-f", "-ttt", "--seccomp-bpf", "-e", "trace=execve,openat,connect",
                   "-o", base + ".strace", rk, "run", "-n", "4", "--ckpt-dir", ck,
                   "--heartbeat-timeout", "5", "--quiet", "--failure-threshold", "1000000",
                   "--events", base + ".events", "--inject", spec, "--",
                   rk, "train", "--model", "cnn-small", "--epochs", "1000", "--no-eval",
                   "--threads", "1", "--seed", "1", "--max-steps", str(200 * (crashes + 1)),
                   "--ckpt-every", "auto", "--mtbf", "30", "--ckpt-async"]
            with open(base + ".out", "w") as out:
                st = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
            evs = [json.loads(l) for l in open(base + ".events") if l.strip()]
            got = phases(parse_strace(base + ".strace"), evs, ck, 4)
            rows[n] += got
            rec[n] += [e["recovery_s"] for e in evs if e.get("action") == "relaunch" and e.get("recovery_s") is not None]
            print(f"relaunch_ab_strace: round {r + 1} {n}: exit {st}, {len(got)} relaunches, load "
                  f"{os.getloadavg()[0]:.2f}", file=sys.stderr)
    names = [x[0] for x in next(v for v in rows.values() if v)[0]]
    print("| phase (ends at) | " + " | ".join(f"{n} median (min-max) s" for n, _ in builds) + " |")
    print("|---|" + "---|" * len(builds))
    for i in range(1, len(names)):
        cells = []
        for n, _ in builds:
            xs = [b[i][1] - b[i - 1][1] for b in rows[n] if b[i][1] is not None and b[i - 1][1] is not None]
            cells.append(f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})" if xs else "-")
        print(f"| {names[i]} | " + " | ".join(cells) + " |")
    cells = [f"{statistics.median(rec[n]):.3f} ({min(rec[n]):.3f}-{max(rec[n]):.3f}), n={len(rec[n])}"
             if rec[n] else "-" for n, _ in builds]
    print("| **recovery_s (events)** | " + " | ".join(cells) + " |")
    print(f"files in {tmp}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
