"""Split a labelled dataset across federated clients (IID and non-IID).

Specs: ``"iid"`` (shuffled equal split), ``"shards:K"`` (each client gets K
single-class shards, the classic sort-and-deal scheme) and ``"dirichlet:ALPHA"``
(per-class Dirichlet(ALPHA) proportions over clients). All are deterministic for
a seed and return disjoint index arrays that together cover every sample.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["parse_spec", "partition"]


def parse_spec(spec: str) -> tuple[str, float]:
    """Parse ``"iid"``, ``"shards:K"`` or ``"dirichlet:ALPHA"`` into (kind, parameter)."""
    if not isinstance(spec, str):
        raise ValueError(f"partition spec must be a str, got {type(spec).__name__}")
    kind, _, arg = spec.strip().partition(":")
    kind = kind.lower()
    if kind == "iid" and not arg:
        return "iid", 0.0
    if kind == "shards" and arg.strip().isdigit() and int(arg) >= 1:
        return "shards", float(int(arg))
    if kind == "dirichlet":
        try:
            alpha = float(arg)
        except ValueError:
            alpha = math.nan
        if math.isfinite(alpha) and 0 < alpha <= 1e6:
            return "dirichlet", alpha
    raise ValueError(f"bad partition spec {spec!r}; use 'iid', 'shards:K' (integer K >= 1) "
                     "or 'dirichlet:ALPHA' (0 < ALPHA <= 1e6)")


def _check_labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise ValueError(f"labels must be a 1-D integer array, got {labels.dtype}{labels.shape}")
    if labels.size and labels.min() < 0:
        raise ValueError("labels must be non-negative")
    return labels


def partition(labels: np.ndarray, num_clients: int, spec: str = "iid", seed: int = 0,
              min_size: int = 1, max_retries: int = 1000) -> list[np.ndarray]:
    """Index arrays (int64, one per client) splitting ``labels`` according to ``spec``.

    Raises ValueError if the spec is bad or some client would get fewer than
    ``min_size`` samples (for dirichlet: after ``max_retries`` re-draws).
    """
    labels = _check_labels(labels)
    kind, param = parse_spec(spec)
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
        raise ValueError(f"num_clients must be an int >= 1, got {num_clients!r}")
    if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
        raise ValueError(f"min_size must be an int >= 0, got {min_size!r}")
    if num_clients * min_size > len(labels):
        raise ValueError(f"{len(labels)} samples cannot give {num_clients} clients "
                         f">= {min_size} samples each")
    rng = np.random.default_rng(seed)
    if kind == "iid":
        parts = np.array_split(rng.permutation(len(labels)), num_clients)
    elif kind == "shards":
        parts = _shards(labels, num_clients, int(param), rng)
    else:
        parts = _dirichlet(labels, num_clients, param, rng, min_size, max_retries)
    out = [np.sort(p).astype(np.int64) for p in parts]
    small = [i for i, p in enumerate(out) if len(p) < min_size]
    if small:
        raise ValueError(f"partition {spec!r} gives clients {small[:10]} fewer than {min_size} "
                         "samples; use fewer clients or fewer shards")
    return out


def _shards(labels: np.ndarray, num_clients: int, k: int, rng: np.random.Generator
            ) -> list[np.ndarray]:
    """Sort by label, cut ``num_clients*k`` shards, deal ``k`` per client.

    Shards are cut inside classes (each shard holds one class) whenever there are
    at least as many shards as classes, and the deal is repaired by swaps so that a
    client's shards come from distinct classes where possible.
    """
    m = num_clients * k
    present = np.unique(labels)
    by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in present]
    if m < len(present) or len(labels) < m:
        # Too few shards for pure ones (or too few samples): contiguous label-sorted cuts.
        order = np.concatenate(by_class) if by_class else np.empty(0, np.int64)
        shards = np.array_split(order, m)
        shard_label = np.array([labels[s[0]] if len(s) else -1 for s in shards])
    else:
        sizes = np.array([len(ix) for ix in by_class], dtype=float)
        counts = _largest_remainder(sizes / sizes.sum() * m, minimum=1, cap=sizes.astype(int))
        shards, shard_label = [], []
        for c, ix, n in zip(present, by_class, counts, strict=True):
            shards += np.array_split(ix, n)
            shard_label += [c] * n
        shard_label = np.array(shard_label)
    perm = rng.permutation(m)
    assign = [list(perm[i * k:(i + 1) * k]) for i in range(num_clients)]
    _repair(assign, shard_label, rng)
    return [np.concatenate([shards[s] for s in a]) for a in assign]


def _largest_remainder(quota: np.ndarray, minimum: int, cap: np.ndarray) -> np.ndarray:
    """Integers summing to round(quota.sum()), each in [minimum, cap], close to quota."""
    total = int(round(quota.sum()))
    counts = np.clip(np.floor(quota).astype(int), minimum, cap)
    while counts.sum() != total:
        gap = quota - counts
        if counts.sum() < total:
            gap[counts >= cap] = -np.inf
            counts[int(np.argmax(gap))] += 1
        else:
            gap[counts <= minimum] = np.inf
            counts[int(np.argmin(gap))] -= 1
    return counts


def _repair(assign: list[list[int]], shard_label: np.ndarray, rng: np.random.Generator) -> None:
    """Swap shards between clients until no client holds two shards of one class.

    Each swap removes one duplicate from a client without adding one to the other,
    so the loop terminates; it stops early when no helpful swap exists.
    """
    while True:
        swapped = False
        for a in rng.permutation(len(assign)):
            labs_a = [shard_label[s] for s in assign[a]]
            dups = [i for i, lab in enumerate(labs_a) if labs_a.count(lab) > 1]
            if not dups:
                continue
            i = dups[-1]
            for b in rng.permutation(len(assign)):
                labs_b = {shard_label[s] for s in assign[b]}
                if b == a or labs_a[i] in labs_b:
                    continue
                j = next((j for j, s in enumerate(assign[b]) if shard_label[s] not in labs_a), None)
                if j is not None:
                    assign[a][i], assign[b][j] = assign[b][j], assign[a][i]
                    swapped = True
                    break
        if not swapped:
            return


def _dirichlet(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator,
               min_size: int, max_retries: int) -> list[np.ndarray]:
    """Per-class Dirichlet(alpha) split, re-drawn until every client has >= min_size."""
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    smallest = 0
    for _ in range(max(1, max_retries)):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for ix in by_class:
            ix = rng.permutation(ix)
            p = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(p)[:-1] * len(ix)).astype(int)
            for client, chunk in enumerate(np.split(ix, cuts)):
                parts[client].append(chunk)
        merged = [np.concatenate(p) if p else np.empty(0, np.int64) for p in parts]
        smallest = min(len(m) for m in merged)
        if smallest >= min_size:
            return merged
    raise ValueError(f"dirichlet:{alpha:g} left a client with {smallest} < {min_size} samples "
                     f"after {max_retries} draws; use a larger alpha, fewer clients or min_size")
