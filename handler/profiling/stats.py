"""Small numeric helpers: percentiles and unions/intersections of [start, end) intervals (ns)."""


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


def length(merged: list[tuple[int, int]]) -> int:
    return sum(end - start for start, end in merged)
