#!/usr/bin/env python3
"""How a PyTorch job's snapshot memory and K scale with the model (issue 33), against the
formula of docs/recovery.md ("Memory: how it scales"):

    bench/snap_scale.py BUILD_DIR [--widths 512,1024,2048,4096] [--layers 4] [--ranks 2] [--steps 8]

For each width, `rk run -n RANKS --launcher local` runs bench/snap_scale_job.py (an MLP of
--layers square Linear layers, Adam, a rekindle.torch Job) with snapshots in memory, and this
script reads what rk run measured (the summary's snapshot_bytes_peak, the snapshot_on event's
generations) and what the Job chose (its "a put takes X ms, a step Y ms: one every K steps"
line). The formula: the node holds two generations of rank 0's state (the model and the
optimiser's state: 4 + 8 bytes a parameter for fp32 Adam, plus the step counters) and two of
each other rank's RNG states (a few KiB); predicted = 2 x (model + optimiser) + the RNG part
(taken from the event), so the ratio measured / predicted shows the store's overhead (headers,
manifest, replica hash). Prints a markdown table; exit 0 when every run finished."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def meminfo(name):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    return 0


def run_one(build, width, layers, ranks, steps, py):
    with tempfile.TemporaryDirectory(prefix="rk-snapscale.") as t:
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        cmd = [os.path.join(build, "rk"), "run", "-n", str(ranks), "--launcher", "local", "--health", "off",
               "--ckpt-dir", f"{t}/ck", "--summary-json", f"{t}/s.json", "--events", f"{t}/e.jsonl", "--",
               py, os.path.join(HERE, "snap_scale_job.py"), "--width", str(width), "--layers", str(layers),
               "--steps", str(steps)]
        t0 = time.monotonic()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        wall = time.monotonic() - t0
        out = p.stdout
        if p.returncode != 0:
            sys.stderr.write(out[-3000:])
            return None
        job = json.loads(next(l for l in out.splitlines() if l.startswith("{\"params\"")))
        m = re.search(r"a put takes ([0-9.]+) ms, a step ([0-9.]+) ms: one every ([0-9]+) step", out)
        s = json.load(open(f"{t}/s.json"))
        ev = [json.loads(l) for l in open(f"{t}/e.jsonl")]
        on = next((e for e in ev if e["kind"] == "snapshot_on"), None)
        # "rank 0: 1 x 6.03 MiB, rank 1: 2 x 0.02 MiB": the other ranks' generations, in MiB
        others = 0.0
        if on:
            for r, n, mib in re.findall(r"rank ([0-9]+): ([0-9]+) x ([0-9.]+) MiB", on["detail"]):
                if r != "0":
                    others += 2 * float(mib) * (1 << 20)
        state = job["model_bytes"] + job["opt_bytes"]
        return {"width": width, "params": job["params"], "state": state, "predicted": 2 * state + others,
                "peak": s.get("snapshot_bytes_peak"), "put_ms": float(m.group(1)) if m else None,
                "step_ms": float(m.group(2)) if m else None, "k": int(m.group(3)) if m else None, "wall": wall}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--widths", default="512,1024,2048,4096")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--python", default="/usr/bin/python3", help="the Python with torch")
    a = ap.parse_args()
    try:
        widths = [int(w) for w in a.widths.split(",")]
    except ValueError:
        print(f"snap_scale: --widths {a.widths!r} is not a list of whole numbers", file=sys.stderr)
        return 2
    if not os.access(os.path.join(a.build, "rk"), os.X_OK):
        print(f"snap_scale: no rk in {a.build}", file=sys.stderr)
        return 2
    print(f"snap_scale: {a.ranks} ranks, {a.layers} layers, load average {os.getloadavg()[0]:.1f}, "
          f"MemTotal {meminfo('MemTotal') / 2**30:.1f} GiB", flush=True)
    print("| width | parameters | model + Adam state | predicted 2 x state + RNG | measured peak | measured / "
          "predicted | put | step | K | put rate |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for w in widths:
        r = run_one(a.build, w, a.layers, a.ranks, a.steps, a.python)
        if r is None or not r["peak"]:
            print(f"| {w} | run failed | | | | | | | | |")
            ok = False
            continue
        rate = r["state"] / (r["put_ms"] / 1e3) / 1e9 if r["put_ms"] else float("nan")
        print(f"| {w} | {r['params']:,} | {r['state'] / 2**20:.1f} MiB | {r['predicted'] / 2**20:.1f} MiB | "
              f"{r['peak'] / 2**20:.1f} MiB | {r['peak'] / r['predicted']:.4f} | {r['put_ms']:.1f} ms | "
              f"{r['step_ms']:.1f} ms | {r['k']} | {rate:.2f} GB/s |", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
