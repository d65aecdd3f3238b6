#!/usr/bin/env python3
"""torchrun --max_restarts against rk run on the same PyTorch DDP script, in one run.

    bench/pytorch_vs_torchrun.py BUILD_DIR [--ranks 2] [--rounds 3] [--threads 1,2]
                                 [--only crash,hang,overhead,paired] [--script PATH] [--hb 5]
                                 [--pin] [--pairs 30] [--paired-steps 300]

The script (default examples/pytorch/train_fashion_mnist.py) runs on both sides through
bench/pytorch_hooks.py, which sets the process group's timeout (--pg-timeout, 60 s; torch's
default is 30 minutes) and prints a line per optimiser step of rank 0. Under torchrun the
script checkpoints and resumes through RK_CKPT_DIR and RK_RESUME=1, as under rk run. Three
measures, side by side, rounds alternating the order of the sides:

- crash: rank 1 is SIGKILLed at step --fault-step; the time from the kill to the first step
  line of the relaunched job (which resumes from its last checkpoint). torchrun is timed at
  its default --monitor_interval (5 s) and at --fast-monitor (0.5 s, "torchrun-fast").
- hang: rank 1 is SIGSTOPped at step --fault-step; the time until the first rank process of
  the old job is gone (torchrun: the survivor's process-group timeout; rk run: its
  --heartbeat-timeout, --hb, then its teardown), until all are gone, and until the first
  resumed step.
- overhead: uninterrupted runs, steps/s from step --warmup to the end, best of --rounds:
  torchrun on the script with the guards off against rk run on it with the guards and the
  replica hash every 10 steps, at each --threads value per rank; also rk run with the guards
  off (supervision alone) and torchrun on plain_ddp.py (the script before its port).
- paired (not in the default --only): the overhead again, at the largest of --batches (each
  side's best batch here), as --pairs pairs of short runs (--paired-steps steps), torchrun
  and rk run back to back, the order alternating (ABBA...). On this 2-CPU virtual machine a
  run's speed is set by the spell of the machine it falls in (two runs of one side, minutes
  apart: 72 and 107 steps/s, each steady within itself), so the measure is the ratio within
  each pair, which a spell longer than a pair cancels: its median, its mean, and a bootstrap
  95% interval of the median; and best against best over all the runs.

Rank processes are found by process tree (the descendants of torchrun, or of rk run and its
keeper, read from /proc), their rank from their environment (RANK or OMPI_COMM_WORLD_RANK),
and signalled by pid, never by a pid a worker printed. Everything started is killed at the
end. Step times are when the harness read a step line from the job's stdout
(PYTHONUNBUFFERED=1 on both sides), so both sides are timed the same way.

torchrun in Debian 12 (python3-torch 1.13.1, Python 3.11) fails at start with its default
--redirects 0 --tee 0 (Std.from_str returns None: Python 3.11 no longer iterates the
zero-valued member of an IntFlag); the bench passes --redirects 9:0 --tee 9:0 (a mapping
naming a local rank that does not exist, so every real rank gets Std.NONE). See
bench/RESULTS.md.

Prints a markdown section for bench/RESULTS.md and writes it to --out
(bench/results/pytorch_vs_torchrun-latest.md). Exit status 0 when every run finished and
resumed, 1 otherwise, 77 when torch or torchrun is missing.
"""

import argparse
import datetime
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
TORCHRUN_FIX = ["--redirects", "9:0", "--tee", "9:0"]
STEP_RE = re.compile(rb"^bench-step (\d+) (?:t=([\d.]+))?")
HOOKS = os.path.join(HERE, "pytorch_hooks.py")
RESUMED_RE = re.compile(r"resumed from \S+ \(step (\d+)")


# --- the scripts the bench knows how to drive --------------------------------------------


def script_profile(path):
    """How to drive a script: its arguments for steps, threads and checkpoints, and each
    side's guard settings. Checkpoints under torchrun: RK_CKPT_DIR and RK_RESUME=1 in the
    environment (what rk run gives its ranks), which rekindle.torch reads unsupervised too."""
    name = os.path.basename(path)
    prof = {
        "steps": lambda n: ["--steps", str(n)],
        "threads": lambda t: ["--threads", str(t)],
        "ckpt_every": lambda every: ["--ckpt-every", str(every)],
        "batch": lambda b: ["--batch", str(b)],
        "guards_off": [],
        "guards_on": [],
    }
    if name == "train_fashion_mnist.py":
        prof["guards_off"] = ["--guard", "off"]
        prof["guards_on"] = ["--guard", "on", "--hash-every", "10"]
    elif name == "plain_ddp.py":
        prof["ckpt_every"] = lambda every: []
    return prof


# --- processes -----------------------------------------------------------------------------


def proc_table():
    """{pid: (ppid, state)} for every process now, from /proc/PID/stat."""
    t = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                st = f.read()
        except OSError:
            continue
        rest = st.rsplit(b")", 1)[1].split()
        t[int(d)] = (int(rest[1]), rest[0].decode())
    return t


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def descendants(root, table):
    kids = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out, stack = [], list(kids.get(root, []))
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(kids.get(p, []))
    return out


def rank_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
    except OSError:
        return None
    for k in (b"RANK", b"OMPI_COMM_WORLD_RANK"):
        if k in env:
            return int(env[k])
    return None


def rank_procs(root, script):
    """{rank: pid} of the job's rank processes: the top-most descendants of root that run
    `script` (bench/pytorch_hooks.py) in a Python interpreter (not torchrun itself, not rk's keeper, a fork of rk
    run whose argv still names the script), not zombies."""
    table = proc_table()
    out = {}
    kids = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    stack = list(kids.get(root, []))
    while stack:
        p = stack.pop()
        state = table[p][1]
        argv = cmdline(p)
        is_rank = (argv and os.path.basename(argv[0]).startswith("python")
                   and script in argv[1:4] and not any(a.endswith("torchrun") for a in argv[:2]))
        if is_rank:
            if state != "Z":
                r = rank_of(p)
                if r is not None:
                    out[r] = p
            continue
        stack.extend(kids.get(p, []))
    return out


class Job:
    """One launch of a side: its stdout read line by line (arrival times), its rank
    processes sampled every 20 ms (first-seen and gone times per pid; not in overhead runs)."""

    def __init__(self, argv, env, log, script, watch=0.02):
        self.script = script
        self.interval = watch
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=open(log, "wb"), stdin=subprocess.DEVNULL)
        self.lines = []  # (t, step)
        self.stamps = []  # (rank 0's own clock at the step, step): free of the pipes' delays
        self.loop_lines = []  # the script's "train loop:" lines
        self.seen = {}  # pid -> (rank, t_first, t_gone or None)
        self.all_pids = set()
        self.lock = threading.Lock()
        self.done = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        if watch:
            self.watcher.start()

    def _read(self):
        for line in self.proc.stdout:
            t = time.monotonic()
            m = STEP_RE.search(line)
            if m:
                with self.lock:
                    self.lines.append((t, int(m.group(1))))
                    if m.group(2):
                        self.stamps.append((float(m.group(2)), int(m.group(1))))
            elif b"train loop:" in line:  # the script's own account of its loop (rank 0)
                with self.lock:
                    self.loop_lines.append(line.decode("utf-8", "replace"))

    def _watch(self):
        while not self.done:
            now = time.monotonic()
            cur = rank_procs(self.proc.pid, self.script)
            with self.lock:
                for r, p in cur.items():
                    if p not in self.seen:
                        self.seen[p] = [r, now, None]
                        self.all_pids.add(p)
                for p, v in self.seen.items():
                    if v[2] is None and p not in cur.values():
                        v[2] = now
            time.sleep(self.interval)

    def last_step(self):
        with self.lock:
            return self.lines[-1][1] if self.lines else -1

    def wait_step(self, step, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.last_step() >= step:
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.005)
        return False

    def ranks_now(self):
        return rank_procs(self.proc.pid, self.script)

    def first_step_after(self, t):
        with self.lock:
            for lt, s in self.lines:
                if lt > t:
                    return lt, s
        return None

    def new_pids_after(self, old):
        with self.lock:
            return sorted(v[1] for p, v in self.seen.items() if p not in old)

    def gone_times(self, pids):
        with self.lock:
            return sorted(self.seen[p][2] for p in pids if p in self.seen and self.seen[p][2])

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        """Kill the launcher and every descendant (by pid, from /proc), rank processes seen
        during the run included."""
        self.done = True
        table = proc_table()
        pids = set(descendants(self.proc.pid, table)) | {
            p for p in self.all_pids if p in table}
        for p in [self.proc.pid, *pids]:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        if self.watcher.is_alive():
            self.watcher.join()
        self.reader.join(timeout=5)


# --- sides ---------------------------------------------------------------------------------


class Bench:
    def __init__(self, a):
        self.a = a
        self.rk = os.path.abspath(os.path.join(a.build, "rk"))
        self.py = a.python
        self.script = os.path.abspath(a.script)
        self.prof = script_profile(self.script)
        self.plain = os.path.join(os.path.dirname(self.script), "plain_ddp.py")
        self.tmp = tempfile.mkdtemp(prefix="pytorch_vs_torchrun.", dir=a.tmpdir)
        self.n = 0
        help_text = subprocess.run([self.rk, "run", "--help"], capture_output=True,
                                   text=True).stdout
        after = help_text.split("--launcher NAME", 1)[-1][:200]
        self.launcher = a.rk_launcher or ("local" if re.search(r"\blocal\b", after)
                                          else "mpirun")

    def env(self, threads):
        e = dict(os.environ)
        e["PYTHONUNBUFFERED"] = "1"
        e["OMP_NUM_THREADS"] = str(threads)
        e["RK_BENCH_PG_TIMEOUT"] = f"{self.a.pg_timeout:g}"
        if self.a.pin:
            e["RK_BENCH_PIN"] = "1"
        for k in ("RK_CKPT_DIR", "RK_RESUME", "RK_INJECT", "RK_HEARTBEAT"):
            e.pop(k, None)
        return e

    def start(self, side, steps, threads, guards, ckpt_every, watch=0.02, batch=None):
        """Starts one job: side "torchrun" or "rk" on the script, or "plain" (torchrun on
        examples/pytorch/plain_ddp.py, the script before its port, no checkpoints)."""
        a = self.a
        script = self.plain if side == "plain" else self.script
        p = script_profile(script)
        self.n += 1
        d = os.path.join(self.tmp, f"{self.n:03d}-{side}")
        ck = os.path.join(d, "ck")
        os.makedirs(ck)
        env = self.env(threads)
        work = [HOOKS, script, *p["steps"](steps), *p["threads"](threads),
                *p["ckpt_every"](ckpt_every), *(p["guards_on"] if guards else p["guards_off"]),
                *(p["batch"](batch) if batch else []),
                *a.script_args.split()]
        if side in ("torchrun", "torchrun-fast", "plain"):
            cmd = ["/usr/bin/torchrun", "--nnodes", "1", "--nproc_per_node", str(a.ranks),
                   "--standalone", "--max_restarts", str(a.max_restarts), *TORCHRUN_FIX]
            if side == "torchrun-fast":
                cmd += ["--monitor_interval", f"{a.fast_monitor:g}"]
            cmd += work
            env["PYTHONPATH"] = os.path.join(SRC, "python") + (
                ":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            if side != "plain":
                env["RK_CKPT_DIR"] = ck
                env["RK_RESUME"] = "1"
        elif side == "bare":
            # no launcher to speak of: the ranks started by a shell with the variables rk run
            # gives them, no supervisor, no heartbeat (the script's guards off): what neither
            # torchrun nor rk run adds
            with socket.socket() as sk:
                sk.bind(("127.0.0.1", 0))
                port = sk.getsockname()[1]
            env.update(PYTHONPATH=os.path.join(SRC, "python") + (
                ":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""), RK_CKPT_DIR=ck,
                RK_RESUME="1", WORLD_SIZE=str(a.ranks), LOCAL_WORLD_SIZE=str(a.ranks),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            line = " ".join(f"RANK={r} LOCAL_RANK={r} " + shlex.join([self.py, *work]) + " &"
                            for r in range(a.ranks))
            cmd = ["/bin/bash", "-c", line + " wait"]
        else:
            cmd = [self.rk, "run", "-n", str(a.ranks), "--quiet", "--heartbeat-timeout",
                   f"{a.hb:g}", "--max-restarts", str(a.max_restarts), "--health", "off",
                   "--ckpt-dir", ck, "--events", os.path.join(d, "events"),
                   "--summary-json", os.path.join(d, "summary")]
            if self.launcher != "mpirun":
                cmd += ["--launcher", self.launcher]
            cmd += ["--", self.py, *work]
        with open(os.path.join(d, "cmd"), "w") as f:
            f.write(" ".join(f"{k}={env[k]}" for k in ("RK_CKPT_DIR", "RK_RESUME", "PYTHONPATH")
                             if k in env and k not in os.environ) + " " + " ".join(cmd) + "\n")
        return Job(cmd, env, os.path.join(d, "log"), HOOKS, watch), d

    def resumed_step(self, d):
        """The step the last resume started from, from rekindle.torch's line in the log."""
        try:
            with open(os.path.join(d, "log"), errors="replace") as f:
                found = RESUMED_RE.findall(f.read())
        except OSError:
            return None
        return int(found[-1]) if found else None

    def rk_events(self, d):
        try:
            with open(os.path.join(d, "events")) as f:
                return [json.loads(x) for x in f if x.strip()]
        except OSError:
            return []

    # --- the three measures ---

    def fault(self, side, sig):
        """A run where rank 1 gets `sig` at step --fault-step: returns a dict of times."""
        a = self.a
        job, d = self.start(side, a.fault_steps, 1, True, a.ckpt_every)
        res = {"side": side, "ok": False}
        try:
            if not job.wait_step(a.fault_step, 180):
                res["error"] = f"never reached step {a.fault_step}"
                return res
            ranks = job.ranks_now()
            if 1 not in ranks:
                res["error"] = f"no rank 1 among {ranks}"
                return res
            old = set(ranks.values())
            at = job.last_step()
            t = time.monotonic()
            os.kill(ranks[1], sig)
            limit = (a.pg_timeout + 120) if sig == signal.SIGSTOP else 120
            end = t + limit
            resumed = None
            while time.monotonic() < end and job.proc.poll() is None:
                new = job.new_pids_after(old)
                if len(new) >= 1:
                    r = job.first_step_after(new[0])
                    if r:
                        resumed = r
                        break
                time.sleep(0.01)
            gone = job.gone_times(old)
            res.update(step=at, first_gone=max(0.0, gone[0] - t) if gone else None,
                       all_gone=max(0.0, gone[-1] - t) if len(gone) == len(old) else None)
            if resumed:
                new = job.new_pids_after(old)
                res.update(relaunched=new[0] - t, resumed=resumed[0] - t)
            rc = job.wait(300)
            res["rc"] = rc
            res["resumed_step"] = self.resumed_step(d)
            res["ok"] = rc == 0 and resumed is not None
            if side == "rk":
                ev = self.rk_events(d)
                kind = "hang" if sig == signal.SIGSTOP else "crash"
                for e in ev:
                    if e.get("kind") == kind:
                        res["rk_recovery_s"] = e.get("recovery_s")
                        res["rk_event_t"] = e.get("t") - (t - job.t0)
                        break
            return res
        finally:
            for p in list(job.all_pids):  # a stopped rank left behind: let SIGKILL reach it
                try:
                    os.kill(p, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            job.kill()
            res["dir"] = d

    def steps_for(self, batch):
        """An overhead run's steps: --steps at the smallest batch, as many samples at a larger
        one, but never under 600 steps."""
        a = self.a
        small = min(a.batch_list)
        return a.steps if batch == small else max(min(600, a.steps), round(a.steps * small / batch))

    def throughput(self, side, threads, batch=None, steps=None):
        """(steps/s, run directory, steal, window steps/s): the rate of steps --warmup to the
        end, the machine's steal time over the run in clock ticks (/proc/stat: CPU time the
        hypervisor gave to others while this machine wanted it), and the median rate of the
        run's windows (window_rates). `steps`: the run's length (default steps_for)."""
        a = self.a
        steal0 = steal_ticks()
        steps = steps or self.steps_for(batch or min(a.batch_list))
        job, d = self.start(side, steps, threads,
                            side == "rk", a.ckpt_every, watch=None, batch=batch)
        try:
            rc = job.wait(600)
            with job.lock:
                lines = list(job.lines)
                loop = list(job.loop_lines)
                stamps = list(job.stamps)
            with open(os.path.join(d, "stdout-loop"), "w") as f:
                f.writelines(loop)
            warm = [x for x in lines if x[1] >= a.warmup]
            if rc != 0 or len(warm) < 2:
                return None, d, steal_ticks() - steal0, None
            (t1, s1), (t2, s2) = warm[0], warm[-1]
            wins = window_rates(stamps, a.warmup, a.ckpt_every)
            return (s2 - s1) / (t2 - t1), d, steal_ticks() - steal0, median(wins)
        finally:
            job.kill()


def window_rates(stamps, warmup, width):
    """Steps/s of each window of `width` consecutive steps from `warmup` on, by rank 0's own
    clock (the bench-step lines' t=). Any `width` consecutive steps hold one checkpoint when
    width is the checkpoint period, and width / K replica hashes when K divides it: every
    window pays the periodic costs in full, and a window that a co-tenant of the machine
    slowed (steal, another process) is one of many, which the median of the windows leaves
    out on both sides alike, where the rate of a whole run carries it."""
    t = {}
    for ts, step in stamps:
        t.setdefault(step, ts)  # one launch: each step once
    out = []
    s = warmup
    while s + width in t and s in t:
        dt = t[s + width] - t[s]
        if dt > 0:
            out.append(width / dt)
        s += width
    return out


def steal_ticks():
    """The machine's steal time so far, in clock ticks (the 8th number of /proc/stat's cpu
    line; 0 where there is none)."""
    try:
        with open("/proc/stat") as f:
            v = f.readline().split()
        return int(v[8]) if len(v) > 8 else 0
    except (OSError, ValueError):
        return 0


def median(v):
    v = sorted(v)
    if not v:
        return None
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


CPU_RE = re.compile(r"train loop: .*?([\d.]+) ms CPU a step on rank 0")


def cpu_per_step(d):
    """Rank 0's CPU milliseconds a step, from the script's own `train loop:` line on its
    stdout (kept in stdout-loop) or in the run's log (None when the script prints none)."""
    found = []
    for name in ("stdout-loop", "log"):
        try:
            with open(os.path.join(d, name), errors="replace") as f:
                found += CPU_RE.findall(f.read())
        except OSError:
            pass
    return float(found[-1]) if found else None


def overhead(a, b, threads, log, P):
    """The per-step overhead: each side at each thread count and batch, rounds alternating
    in order; samples/s compared best with best (each side at its best setting), then by
    medians and by the ratio within a round. Returns False when a run failed."""
    ok = True
    sides = ["torchrun", "rk", "rk-noguard"] + (["plain"] if os.path.exists(b.plain) else [])
    settings = [(t, bt) for bt in a.batch_list for t in threads]
    runs = {(s, t, bt): [] for s in sides for t, bt in settings}  # samples/s, None: failed
    cpus = {k: [] for k in runs}
    steal = {k: [] for k in runs}
    for r in range(a.rounds):
        order = [(s, t, bt) for t, bt in settings for s in sides]
        if r % 2:
            order.reverse()
        for s, t, bt in order:
            log(f"overhead round {r + 1}: {s} @{t} threads, batch {bt}")
            v, d, st, _ = b.throughput(s, t, bt)
            c = cpu_per_step(d)
            log(f"  {v} steps/s, {c} ms CPU a step on rank 0, steal {st} ticks")
            runs[(s, t, bt)].append(v * bt if v else None)
            cpus[(s, t, bt)].append(c)
            steal[(s, t, bt)].append(st)
            ok &= v is not None

    def vals(side, keys):
        return [x for k in keys for x in runs[(side, *k)] if x]

    def best(side, keys):
        v = vals(side, keys)
        return max(v) if v else None

    def where(side):
        v = [(x, k) for k in settings for x in runs[(side, *k)] if x]
        return max(v)[1] if v else None

    P(f"### overhead: samples/s of an uninterrupted run, {a.rounds} alternating rounds")
    P("")
    P(f"Each side at each setting: threads a rank {', '.join(map(str, threads))}; global batch "
      f"{', '.join(map(str, a.batch_list))} ({', '.join(str(b.steps_for(x)) for x in a.batch_list)} "
      f"steps, steps {a.warmup} on timed). torchrun: the script with "
      f"`{' '.join(b.prof['guards_off'])}`; rk run: the script with "
      f"`{' '.join(b.prof['guards_on'])}` (guards and the replica hash every 10 steps), "
      f"supervised; both checkpoint every {a.ckpt_every} steps; rk run, guards off: the script "
      f"with `{' '.join(b.prof['guards_off'])}` under rk run (supervision alone)"
      + ("; plain: torchrun on `plain_ddp.py`, the script before its port (no rekindle.torch, "
         "no checkpoints), for reference" if "plain" in sides else "") + ".")
    P("")
    P("| setting | torchrun best | rk run best | rk run / torchrun | overhead | goal | met? "
      "| rk run, guards off | its overhead |" + (" plain best | rk run / plain |" if "plain" in sides else ""))
    P("|---|---|---|---|---|---|---|---|---|" + ("---|---|" if "plain" in sides else ""))
    rows = [(f"{t} threads, batch {bt}", [(t, bt)]) for t, bt in settings]
    wt, wr = where("torchrun"), where("rk")
    rows.append((f"best vs best (torchrun at {wt[0]} threads, batch {wt[1]}; rk run at "
                 f"{wr[0]} threads, batch {wr[1]})" if wt and wr else "best vs best", settings))
    for label, keys in rows:
        bt, br = best("torchrun", keys), best("rk", keys)
        if not bt or not br:
            P(f"| {label} | - | - | - | - | <= 2% | - | - | - |")
            continue
        ov = 1 - br / bt
        row = (f"| {label} | {bt:.0f} | {br:.0f} | {br / bt:.3f} | {100 * ov:.1f}% | <= 2% | "
               f"{'yes' if ov <= 0.02 else 'no'} |")
        bo = best("rk-noguard", keys)
        row += f" {fmt(bo, 0)} | {fmt(100 * (1 - bo / bt) if bo else None, 1)}% |"
        if "plain" in sides:
            bp = best("plain", keys)
            row += f" {fmt(bp, 0)} | {fmt(br / bp if bp else None, 3)} |"
        P(row)
    P("")
    P("The same runs by their median (a best of N favours the side with the luckiest run; on a "
      "machine shared with other work the median says what a run usually gets), by the median "
      "of each round's ratio to torchrun's run at the same setting (the two ran minutes apart, "
      "so a slow spell of the machine falls on both), and by rank 0's CPU time a step (its "
      "`time.process_time()` over the loop, as the script prints it; the least of the rounds; "
      "on a loaded machine it grows with the wall clock). Overhead and extra CPU are against "
      "torchrun; negative: less than torchrun. Steal: the machine's /proc/stat steal time over "
      "each run, clock ticks (CPU time its hypervisor gave to others), median and most:")
    P("")
    P("| setting | side | median samples/s | overhead | median of the rounds' ratios | "
      "least CPU ms a step | extra CPU | steal median / most |")
    P("|---|---|---|---|---|---|---|---|")
    for t, bt in settings:
        mt = median(vals("torchrun", [(t, bt)]))
        ct = min([x for x in cpus[("torchrun", t, bt)] if x], default=None)
        for side in sides:
            m = median(vals(side, [(t, bt)]))
            c = min([x for x in cpus[(side, t, bt)] if x], default=None)
            pairs = [x / y for x, y in zip(runs[(side, t, bt)], runs[("torchrun", t, bt)]) if x and y]
            pr = median(pairs) if side != "torchrun" else None
            st = steal[(side, t, bt)]
            P(f"| {t} threads, batch {bt} | {side} | {fmt(m, 0)} | "
              f"{fmt(100 * (1 - m / mt) if m and mt else None, 1)}% | "
              f"{fmt(100 * (1 - pr) if pr else None, 1)}% | {fmt(c, 3)} | "
              f"{fmt(100 * (c / ct - 1) if c and ct else None, 1)}% | "
              f"{median(st) if st else '-'} / {max(st) if st else '-'} |")
    P("")
    P("Runs (samples/s, rounds in order; rank 0's CPU ms a step; steal ticks):")
    P("")
    for (s, t, bt), v in runs.items():
        P(f"- {s} @{t} threads, batch {bt}: " + ", ".join(fmt(x, 0) for x in v) + "; CPU "
          + ", ".join(fmt(x, 3) for x in cpus[(s, t, bt)]) + "; steal "
          + ", ".join(str(x) for x in steal[(s, t, bt)]))
    P("")
    return ok


def paired(a, b, threads, log, P):
    """Pairs of short runs, torchrun and rk run back to back in alternating order, at the
    largest batch: the ratio within each pair. Returns False when a run failed."""
    import random as _random

    bt = max(a.batch_list)
    t = min(threads)
    steps = a.paired_steps
    sides = ["torchrun", "rk"] + (["rk-noguard"] if a.paired_noguard else []) + (
        ["bare"] if a.paired_bare else [])
    rates = {s_: [] for s_ in sides}  # per pair: window-median samples/s (None: failed)
    ok = True
    for i in range(a.pairs):
        order = sides if i % 2 == 0 else sides[::-1]
        for s_ in order:
            v, d, st, w = b.throughput(s_, t, bt, steps)
            log(f"pair {i + 1}: {s_}: {v} steps/s, windows' median {w}")
            rates[s_].append(w * bt if w else None)
            ok &= w is not None
    pairs = [(x, y) for x, y in zip(rates["torchrun"], rates["rk"]) if x and y]
    ratios = [y / x for x, y in pairs]
    rng = _random.Random(1)
    boots = sorted(median([rng.choice(ratios) for _ in ratios]) for _ in range(2000)) if ratios else []
    lo, hi = (boots[int(0.025 * len(boots))], boots[int(0.975 * len(boots)) - 1]) if boots else (None, None)
    med = median(ratios)
    mean = sum(ratios) / len(ratios) if ratios else None
    bt_best = max((x for x, _ in pairs), default=None)
    rk_best = max((y for _, y in pairs), default=None)
    P(f"### overhead, paired: {a.pairs} pairs of runs back to back, batch {bt}, {t} thread a rank")
    P("")
    P(f"Each run: {steps} steps; its samples/s is the median of its windows of {a.ckpt_every} "
      f"steps from step {a.warmup} on (window_rates: each window holds one checkpoint and, on "
      f"rk run's side, {a.ckpt_every // 10} replica hashes). torchrun runs the script with "
      f"`{' '.join(b.prof['guards_off'])}`, rk run with `{' '.join(b.prof['guards_on'])}` "
      f"(guards and the replica hash every 10 steps); the order alternates pair by pair. "
      f"Overhead = 1 - rk run / torchrun.")
    P("")
    P("| measure | rk run / torchrun | overhead | goal | met? |")
    P("|---|---|---|---|---|")
    if med is not None:
        P(f"| median of the pairs' ratios (bootstrap 95%: {lo:.3f} to {hi:.3f}) | {med:.3f} | "
          f"{100 * (1 - med):.1f}% (95%: {100 * (1 - hi):.1f}% to {100 * (1 - lo):.1f}%) | <= 2% | "
          f"{'yes' if 1 - med <= 0.02 else 'no'} |")
        P(f"| mean of the pairs' ratios | {mean:.3f} | {100 * (1 - mean):.1f}% | <= 2% | "
          f"{'yes' if 1 - mean <= 0.02 else 'no'} |")
        P(f"| best run against best run ({bt_best:.0f} and {rk_best:.0f} samples/s) | "
          f"{rk_best / bt_best:.3f} | {100 * (1 - rk_best / bt_best):.1f}% | <= 2% | "
          f"{'yes' if 1 - rk_best / bt_best <= 0.02 else 'no'} |")
    P("")
    P("Runs (samples/s, pair by pair):")
    P("")
    for s_ in sides:
        P(f"- {s_}: " + ", ".join(fmt(x, 0) for x in rates[s_]))
    P("- ratios rk run / torchrun: " + ", ".join(f"{r:.3f}" for r in ratios))
    if ratios:
        P(f"- rk run / torchrun: geometric mean of the pairs' ratios {geomean(ratios):.3f}")
    for other, what in (("rk-noguard", "rk run with the guards off"),
                        ("bare", "the ranks started by a shell, no supervisor, guards off")):
        if other in rates:
            ng = [y / x for x, y in zip(rates["torchrun"], rates[other]) if x and y]
            if ng:
                P(f"- {what} / torchrun: median of the pairs {median(ng):.3f}, geometric mean "
                  f"{geomean(ng):.3f}")
    P("")
    return ok


def recorded_args(argv):
    """The command line as the results record it: without --out and --tmpdir, whose values are
    this machine's paths, not part of the measure."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in ("--out", "--tmpdir"):
            skip = True
        elif not x.startswith(("--out=", "--tmpdir=")):
            out.append(x)
    return out


def geomean(v):
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None


def fmt(x, nd=2):
    return "-" if x is None else f"{x:.{nd}f}"


def main():
    ap = argparse.ArgumentParser(description="torchrun against rk run on a PyTorch script")
    ap.add_argument("build", help="the build directory holding rk")
    ap.add_argument("--script", default=os.path.join(SRC, "examples", "pytorch",
                                                     "train_fashion_mnist.py"),
                    help="the ported DDP script (default: the example); plain_ddp.py beside "
                    "it, when there, is timed under torchrun too")
    ap.add_argument("--script-args", default="",
                    help="more arguments for the script on every side, e.g. '--batch 512'")
    ap.add_argument("--python", default=None,
                    help="default: tests/pyfind.sh torch xxhash numpy")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fault-rounds", type=int, default=2)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=600,
                    help="steps of an overhead run at the smallest batch (a larger batch: as "
                    "many samples, at least 600 steps)")
    ap.add_argument("--batches", default="64",
                    help="global batches of the overhead runs, comma-separated: each side is "
                    "timed at each, and compared best (samples/s) with best, e.g. 64,1024")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--pin", action="store_true",
                    help="each rank pins itself to CPU LOCAL_RANK (both sides alike)")
    ap.add_argument("--fault-step", type=int, default=60)
    ap.add_argument("--fault-steps", type=int, default=150)
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--hb", type=float, default=5, help="rk run --heartbeat-timeout")
    ap.add_argument("--pg-timeout", type=float, default=60)
    ap.add_argument("--max-restarts", type=int, default=3)
    ap.add_argument("--fast-monitor", type=float, default=0.5,
                    help="the crash runs also time torchrun with this --monitor_interval "
                    "(its default is 5 s; 0: not)")
    ap.add_argument("--rk-launcher", default=None,
                    help="rk run --launcher (default: local when rk run has it, else mpirun)")
    ap.add_argument("--only", default="crash,hang,overhead",
                    help="comma-separated: crash, hang, overhead, paired")
    ap.add_argument("--pairs", type=int, default=30, help="paired: pairs of runs")
    ap.add_argument("--paired-steps", type=int, default=300, help="paired: steps a run")
    ap.add_argument("--paired-noguard", action="store_true",
                    help="paired: rk run with the guards off in each pair too")
    ap.add_argument("--paired-bare", action="store_true",
                    help="paired: the ranks started by a shell (no launcher, no supervisor, "
                    "guards off) in each pair too")
    ap.add_argument("--tmpdir", default=None)
    ap.add_argument("--out", default=os.path.join(HERE, "results",
                                                  "pytorch_vs_torchrun-latest.md"))
    a = ap.parse_args()
    try:
        a.batch_list = [int(x) for x in a.batches.split(",")]
        if not a.batch_list or min(a.batch_list) < a.ranks:
            raise ValueError
    except ValueError:
        ap.error(f"--batches: {a.batches!r} is not a list of batches of at least --ranks "
                 f"({a.ranks}) samples")
    if not os.path.exists(a.script):
        print(f"SKIP: {a.script} is not there", file=sys.stderr)
        return 77
    if a.python is None:
        r = subprocess.run([os.path.join(SRC, "tests", "pyfind.sh"), "torch", "xxhash", "numpy"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout.strip(), file=sys.stderr)
            return 77
        a.python = r.stdout.strip()
    if not shutil.which("/usr/bin/torchrun"):
        print("SKIP: /usr/bin/torchrun not installed (python3-torch)", file=sys.stderr)
        return 77
    b = Bench(a)
    only = set(a.only.split(","))
    threads = [int(t) for t in a.threads.split(",")]
    log = lambda m: print(f"pytorch_vs_torchrun: {m}", file=sys.stderr, flush=True)
    out = []
    P = out.append
    started = datetime.datetime.utcnow()
    cmdline = "bench/pytorch_vs_torchrun.py " + " ".join(recorded_args(sys.argv[1:]))
    P(f"## PyTorch: torchrun against rk run — {started:%Y-%m-%d}")
    P("")
    P(f"- command: `{cmdline}`")
    P(f"- date: {started:%Y-%m-%d %H:%M} UTC; load average at the start "
      f"{' '.join(open('/proc/loadavg').read().split()[:3])}")
    P(f"- script: `{os.path.relpath(b.script, SRC)}`, {a.ranks} ranks, gloo on CPU, "
      f"checkpoint every {a.ckpt_every} steps; interpreter {a.python}"
      + (f"; script arguments `{a.script_args}`" if a.script_args else ""))
    P(f"- torchrun: `torchrun --nnodes 1 --nproc_per_node {a.ranks} --standalone "
      f"--max_restarts {a.max_restarts} {' '.join(TORCHRUN_FIX)}"
      + f"` (its default --monitor_interval, 5 s; \"torchrun-fast\": the same with "
      f"`--monitor_interval {a.fast_monitor:g}`), process-group timeout {a.pg_timeout:g} s "
      f"(set by bench/pytorch_hooks.py; torch's default is 30 min)")
    P(f"- rk run: `rk run -n {a.ranks} --heartbeat-timeout {a.hb:g} --max-restarts "
      f"{a.max_restarts} --health off --ckpt-dir ...` with launcher {b.launcher}")
    P("")
    ok = True
    for kind, sig in (("crash", signal.SIGKILL), ("hang", signal.SIGSTOP)):
        if kind not in only:
            continue
        rows = []
        sides = ["torchrun", "rk"] + (["torchrun-fast"] if kind == "crash" and a.fast_monitor
                                      else [])
        for r in range(a.fault_rounds):
            for side in (sides if r % 2 == 0 else sides[::-1]):
                log(f"{kind} round {r + 1}: {side}")
                res = b.fault(side, sig)
                log(f"  {res}")
                rows.append(res)
                ok &= res["ok"]
        what = ("SIGKILL of rank 1" if kind == "crash" else "SIGSTOP of rank 1")
        P(f"### {kind}: {what} at step {a.fault_step}, seconds after the signal")
        P("")
        P("| round | side | first old rank gone | all old ranks gone | new ranks started | "
          "first resumed step | resumed at step | rk's own figure | exit |")
        P("|---|---|---|---|---|---|---|---|---|")
        for i, res in enumerate(rows):
            own = "-"
            if res["side"] == "rk":
                own = (f"recovery_s {fmt(res.get('rk_recovery_s'))}" if kind == "crash" else
                       f"hang event at {fmt(res.get('rk_event_t'))}")
            P(f"| {i // len(sides) + 1} | {res['side']} | {fmt(res.get('first_gone'))} | "
              f"{fmt(res.get('all_gone'))} | {fmt(res.get('relaunched'))} | {fmt(res.get('resumed'))} | "
              f"{res.get('resumed_step', '-')} | {own} | {res.get('rc')} |")
        best = {}
        for side in sides:
            v = [x["resumed"] for x in rows if x["side"] == side and x.get("resumed")]
            best[side] = min(v) if v else None
        P("")
        for side in sides:
            if side != "rk" and best[side] and best["rk"]:
                P(f"Best {kind}-to-resumed-step: {side} {best[side]:.2f} s, rk run "
                  f"{best['rk']:.2f} s: **{best[side] / best['rk']:.1f}x** faster with rk run.")
                P("")
        P("")
    if "overhead" in only:
        ok &= overhead(a, b, threads, log, P)
    if "paired" in only:
        ok &= paired(a, b, threads, log, P)
    P(f"- load average at the end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    text = "\n".join(out) + "\n"
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    print(text)
    if not a.tmpdir:
        shutil.rmtree(b.tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
