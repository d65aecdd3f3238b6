#!/usr/bin/env python3
"""Fit Weibull lifetimes to the Titan GPU data and write src/health/titan_fit.h.

The simulated fleet (src/health/sim.c, docs/sim.md) draws each GPU's time to failure from
these fits, so that simulated GPUs age like the 18,688 Tesla K20X GPUs of ORNL's Titan:

  G. Ostrouchov, D. Maxwell, R. A. Ashraf, C. Engelmann, M. Shankar, J. H. Rogers,
  "GPU Lifetimes on Titan Supercomputer: Survival Analysis and Reliability", SC20.

Input: ../shared/data/titan/gc_full.csv (relative to the repository root; --data to change),
one row per stay of a GPU in a slot: SN,location,insert,remove,duration,out,event with
duration in seconds and event DBE (double-bit ECC error), OTB (off the bus) or empty
(censored: the stay ended without a failure). Each row is one lifetime; rows without a
duration and without the insert and remove times to compute it are skipped and counted.

Three fits, each a Weibull with right censoring by maximum likelihood: time to DBE (OTB and
no event censored), time to OTB (DBE and no event censored) and time to any failure. The
shape k solves the profile-likelihood equation

    sum(t^k ln t) / sum(t^k) - 1/k - (1/r) sum_{events} ln t = 0

(r events; the left side rises with k), by Newton's method kept inside a bisection bracket;
then lambda = (sum(t^k) / r)^(1/k). Times are in hours. Standard library only.

    python3 scripts/fit_titan.py            print the fits and write src/health/titan_fit.h
    python3 scripts/fit_titan.py --check    exit 1 if the committed header differs
"""
import argparse
import csv
import datetime
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.path.normpath(os.path.join(ROOT, "..", "shared", "data", "titan", "gc_full.csv"))
HEADER = os.path.join(ROOT, "src", "health", "titan_fit.h")
COMMAND = "python3 scripts/fit_titan.py"


def load(path):
    """(hours, event) per usable row, and counts of what was skipped and why."""
    rows, skipped = [], {"no duration, no insert/remove": 0, "duration not positive": 0}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        need = {"insert", "remove", "duration", "event"}
        if not reader.fieldnames or not need <= set(reader.fieldnames):
            sys.exit(f"fit_titan: {path}: header lacks one of {sorted(need)}")
        for line, r in enumerate(reader, start=2):
            ev = r["event"].strip()
            if ev not in ("", "DBE", "OTB"):
                sys.exit(f"fit_titan: {path}:{line}: event '{ev}' (DBE, OTB or empty)")
            d = r["duration"].strip()
            if d:
                try:
                    sec = float(d)
                except ValueError:
                    sys.exit(f"fit_titan: {path}:{line}: duration '{d}' is not a number")
            elif r["insert"].strip() and r["remove"].strip():
                try:
                    a = datetime.datetime.fromisoformat(r["insert"].strip())
                    b = datetime.datetime.fromisoformat(r["remove"].strip())
                except ValueError:
                    sys.exit(f"fit_titan: {path}:{line}: insert/remove is not a date")
                sec = (b - a).total_seconds()
            else:
                skipped["no duration, no insert/remove"] += 1
                continue
            if not sec > 0:
                skipped["duration not positive"] += 1
                continue
            rows.append((sec / 3600.0, ev))
    return rows, skipped


def weibull_mle(times, events):
    """Censored Weibull MLE: (k, lambda, r events, n - r censored, log-likelihood)."""
    r = sum(1 for e in events if e)
    if r == 0:
        sys.exit("fit_titan: no events to fit")
    s = max(times)
    x = [t / s for t in times]  # scaled to (0, 1]: t^k cannot overflow
    lx = [math.log(v) for v in x]
    mean_ev = math.fsum(l for l, e in zip(lx, events) if e) / r

    def g(k):  # the profile equation and its derivative in k
        w = [v**k for v in x]
        a = math.fsum(w)
        b = math.fsum(wi * l for wi, l in zip(w, lx)) / a
        c = math.fsum(wi * l * l for wi, l in zip(w, lx)) / a
        return b - 1.0 / k - mean_ev, (c - b * b) + 1.0 / (k * k)

    lo, hi = 0.01, 100.0
    if g(lo)[0] > 0 or g(hi)[0] < 0:
        sys.exit("fit_titan: the shape is outside [0.01, 100]")
    k = 1.0
    for _ in range(200):
        f, df = g(k)
        if f > 0:
            hi = k
        else:
            lo = k
        step = k - f / df if df > 0 else None
        nk = step if step is not None and lo < step < hi else 0.5 * (lo + hi)
        if abs(nk - k) <= 1e-13 * k:
            k = nk
            break
        k = nk
    lam_scaled = (math.fsum(v**k for v in x) / r) ** (1.0 / k)
    lam = lam_scaled * s
    ll = r * math.log(k) - r * k * math.log(lam) + (k - 1) * math.fsum(
        math.log(t) for t, e in zip(times, events) if e
    ) - math.fsum((t / lam) ** k for t in times)
    return k, lam, r, len(times) - r, ll


def header_text(fits, n_rows, n_skipped, data_name):
    lines = [
        "/*",
        " * Weibull fits of GPU lifetimes on ORNL's Titan supercomputer (18,688 Tesla K20X GPUs),",
        " * from the data of G. Ostrouchov et al., \"GPU Lifetimes on Titan Supercomputer: Survival",
        " * Analysis and Reliability\", SC20. The simulated fleet (sim.c, docs/sim.md) draws its",
        " * times to failure from these numbers. GENERATED: do not edit. Regenerate with",
        f" *     {COMMAND}",
        f" * from ../shared/data/titan/{data_name} ({n_rows} rows used, {n_skipped} skipped for",
        " * want of a duration). Censored maximum likelihood; times in hours of service;",
        " * S(t) = exp(-(t / lambda)^k).",
        " */",
        "#ifndef RK_TITAN_FIT_H",
        "#define RK_TITAN_FIT_H",
        "",
    ]
    for key, (k, lam, r, c, ll) in fits:
        lines += [
            f"/* time to {key_desc(key)}:",
            f" * {r} events, {c} censored, log-likelihood {ll:.3f} */",
            f"#define RK_TITAN_{key}_SHAPE {k:.6f}",
            f"#define RK_TITAN_{key}_SCALE_H {lam:.1f}",
            f"#define RK_TITAN_{key}_EVENTS {r}",
            f"#define RK_TITAN_{key}_CENSORED {c}",
            "",
        ]
    lines += ["#endif", ""]
    return "\n".join(lines)


def key_desc(key):
    return {
        "DBE": "a double-bit ECC error (OTB and no event censored)",
        "OTB": "falling off the bus (DBE and no event censored)",
        "ANY": "any failure, DBE or OTB",
    }[key]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=DEFAULT_DATA, help="gc_full.csv (default: %(default)s)")
    ap.add_argument("--out", default=HEADER, help="header to write (default: %(default)s)")
    ap.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = ap.parse_args()
    if not os.path.isfile(args.data):
        sys.exit(
            f"fit_titan: {args.data}: no such file. The Titan data (gc_full.csv, see "
            "../shared/data/README.md) must be present to refit; the committed "
            "src/health/titan_fit.h keeps the last fit."
        )
    rows, skipped = load(args.data)
    if not rows:
        sys.exit(f"fit_titan: {args.data}: no usable rows")
    times = [t for t, _ in rows]
    fits = []
    for key, is_event in (
        ("DBE", lambda e: e == "DBE"),
        ("OTB", lambda e: e == "OTB"),
        ("ANY", lambda e: e != ""),
    ):
        fits.append((key, weibull_mle(times, [is_event(e) for _, e in rows])))

    n_skipped = sum(skipped.values())
    print(f"{args.data}: {len(rows)} rows used", end="")
    print("".join(f", {v} skipped ({why})" for why, v in skipped.items() if v))
    print(f"{'fit':<4} {'shape k':>9} {'scale h':>10} {'scale y':>8} {'median h':>9} "
          f"{'events':>7} {'censored':>9}")
    for key, (k, lam, r, c, _) in fits:
        med = lam * math.log(2.0) ** (1.0 / k)
        print(f"{key:<4} {k:9.4f} {lam:10.1f} {lam / 8766:8.2f} {med:9.1f} {r:7d} {c:9d}")

    text = header_text(fits, len(rows), n_skipped, os.path.basename(args.data))
    if args.check:
        try:
            with open(args.out) as f:
                same = f.read() == text
        except OSError:
            same = False
        print(f"{args.out}: {'identical' if same else 'DIFFERS'}")
        return 0 if same else 1
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, args.out)
    print(f"wrote {os.path.relpath(args.out, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
