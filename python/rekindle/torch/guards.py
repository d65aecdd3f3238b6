"""The step guards' arithmetic (docs/guards.md): src/runtime/guard.c's in Python, decision for
decision (python/tests/test_guards_c.py feeds both the same generated numbers)."""

import math
import sys

_DBL_MIN = sys.float_info.min  # the smallest normal double


def grad_outliers(norms, ratio):
    """Ranks whose gradient norm is far off the others' (docs/guards.md), rk_guard_outliers's
    rule: a non-finite norm; among the usable norms (finite, not negative: a rank without
    samples passes a negative one), with 3 or more a norm above ratio x their median, with 2
    the larger above ratio x the smaller. Ranks in order."""
    bad = [r for r, x in enumerate(norms) if not math.isfinite(x)]
    ok = [r for r, x in enumerate(norms) if math.isfinite(x) and x >= 0]
    if len(ok) >= 3:
        lim = ratio * _median([norms[r] for r in ok])
        return sorted(bad + [r for r in ok if norms[r] > lim])
    if len(ok) == 2:
        a, b = ok
        hi, lo = (a, b) if norms[a] >= norms[b] else (b, a)
        if norms[hi] > ratio * norms[lo]:
            return sorted(bad + [hi])
    return bad


def spike_zscore(window, loss):
    """Robust z-score of `loss` against the accepted losses in `window`: (loss - median) /
    (1.4826 MAD), the MAD floored at 1% of the median; 0 when there is nothing to compare."""
    if not window:
        return 0.0
    med = _median(window)
    mad = max(_median([abs(x - med) for x in window]), 1e-2 * abs(med))
    if not mad > 0:
        return 0.0
    return (loss - med) / (1.4826 * mad)


def spike_zscore_over(window, loss, limit):
    """spike_zscore(window, loss) where it may exceed `limit`; 0.0 where it cannot, found
    without the MAD (it runs every step): the MAD is at least 1% of the median's size, so a
    loss within half of limit x 1.4826 x 1% of it above the median has a z-score of at most
    about limit / 2. Not where that 1% is subnormal (1.4826 x MAD rounds to a coarse step
    there) or loss - median overflows (an infinite z-score is above any limit)."""
    if not window:
        return 0.0
    if limit > 0:
        s = sorted(window)
        n = len(s)
        med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
        d = loss - med
        if d <= 0.5 * limit * 1.4826e-2 * abs(med) and d < math.inf and 1e-2 * abs(med) >= _DBL_MIN:
            return 0.0
    return spike_zscore(window, loss)


def replica_vote(hashes):
    """Majority vote over replica hashes (one per rank, at least one), rk_guard_vote's:
    (root, minority, strict), root the lowest rank holding the most common hash, minority the
    ranks whose hash differs from root's, strict whether more than half the ranks hold it."""
    counts = [hashes.count(h) for h in hashes]
    root = max(range(len(hashes)), key=lambda r: (counts[r], -r))
    minority = [r for r, h in enumerate(hashes) if h != hashes[root]]
    return root, minority, counts[root] * 2 > len(hashes)


def _median(v):
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
