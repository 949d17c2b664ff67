"""Small numeric helpers: percentiles and unions/intersections of [start, end) intervals (ns)."""
import numpy as np


def percentile(ordered: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not ordered:
        return None
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def merge(intervals) -> list[tuple[int, int]]:
    """The union of the intervals as sorted, disjoint intervals."""
    merged = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def intersect(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Intersection of two merged interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of merged intervals a that no interval of merged b covers."""
    out, j = [], 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > start:
                out.append((start, b[k][0]))
            start = max(start, b[k][1])
            k += 1
        if end > start:
            out.append((start, end))
    return out


def length(merged: list[tuple[int, int]]) -> int:
    return sum(end - start for start, end in merged)


def nesting_parents(ranges) -> list[int]:
    """For ranges of one thread sorted by (start, -end), which push/pop ranges nest: the
    index of each one's innermost enclosing range, -1 for none."""
    parents, stack = [], []
    for i, r in enumerate(ranges):
        while stack and ranges[stack[-1]].end <= r.start:
            stack.pop()
        parents.append(stack[-1] if stack else -1)
        stack.append(i)
    return parents


# The same on numpy columns, for millions of intervals: (starts, ends) arrays, int64 ns, exact.

def merge_arrays(starts, ends) -> tuple:
    """merge() of parallel arrays: sorted, disjoint (and never touching) intervals."""
    keep = ends > starts
    if not keep.all():
        starts, ends = starts[keep], ends[keep]
    del keep
    if not len(starts):
        return starts, ends
    if (starts[1:] < starts[:-1]).any():  # sorted already (a process's kernels, say): no copy
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        del order
    # The running furthest end: at the last interval of a merged group it is the group's end. Masks, not
    # index arrays: a rank's 1.3 M kernels would hold two int64 indices of each merged interval.
    reach = np.maximum.accumulate(ends)
    head = np.empty(len(starts), dtype=bool)
    head[0] = True
    np.greater(starts[1:], reach[:-1], out=head[1:])
    merged_starts = starts[head]
    head[:-1] = head[1:]  # now the last of each group
    head[-1] = True
    return merged_starts, reach[head]


def covered_before(merged: tuple, times) -> np.ndarray:
    """How much of the merged intervals lies before each time (ns)."""
    starts, ends = merged
    times = np.asarray(times, dtype=np.int64)
    if not len(starts):
        return np.zeros(len(times), dtype=np.int64)
    done = np.empty(len(starts) + 1, dtype=np.int64)
    done[0] = 0
    np.subtract(ends, starts, out=done[1:])
    np.cumsum(done[1:], out=done[1:])
    i = np.searchsorted(starts, times, side="right")  # intervals starting at or before each time
    last = np.maximum(i - 1, 0)
    partial = np.where(i > 0, np.minimum(times, ends[last]) - starts[last], 0)
    return done[last] * (i > 0) + np.maximum(partial, 0)


def overlap(intervals: list[tuple[int, int]], merged: tuple) -> int:
    """length(intersect(intervals, merged)) for merged Python intervals and merged arrays."""
    if not intervals:
        return 0
    bounds = np.array(intervals, dtype=np.int64)
    return int((covered_before(merged, bounds[:, 1]) - covered_before(merged, bounds[:, 0])).sum())


def as_list(merged: tuple) -> list[tuple[int, int]]:
    return list(zip(merged[0].tolist(), merged[1].tolist()))
