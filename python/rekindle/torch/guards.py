"""The step guards' arithmetic (docs/guards.md)."""


def grad_outliers(norms, ratio):
    """Ranks whose (finite) gradient norm is far off the others' (docs/guards.md): with 3 or
    more ranks a norm above ratio x the median; with 2 the larger above ratio x the smaller."""
    n = len(norms)
    if n >= 3:
        med = _median(norms)
        return [r for r in range(n) if norms[r] > ratio * med]
    if n == 2:
        hi = 0 if norms[0] >= norms[1] else 1
        return [hi] if norms[hi] > ratio * norms[1 - hi] else []
    return []


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
    about limit / 2."""
    if not window:
        return 0.0
    if limit > 0:
        s = sorted(window)
        n = len(s)
        med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
        if loss - med <= 0.5 * limit * 1.4826e-2 * abs(med):
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
