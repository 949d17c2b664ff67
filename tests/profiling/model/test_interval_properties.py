"""The interval arithmetic every busy share and overlap stands on (handler/profiling/stats.py), as
properties over generated intervals: the numpy union equals the plain one, and the covered length
before a time never exceeds the time's span nor the union's length."""
import numpy as np
from hypothesis import given, settings, strategies as st

from handler.profiling.stats import covered_before, intersect, length, merge, merge_arrays, overlap

BOUND = 10**15  # ns: eleven days, past any capture
intervals = st.lists(st.tuples(st.integers(0, BOUND), st.integers(-10**6, 10**9)).map(lambda p: (p[0], p[0] + p[1])),
                     max_size=60)
sorted_intervals = intervals.map(sorted)  # the readers pass a rank's rows in start order


@settings(max_examples=300, deadline=None)
@given(sorted_intervals)
def test_the_numpy_union_is_the_plain_union(rows):
    starts = np.array([a for a, _ in rows], dtype=np.int64)
    ends = np.array([b for _, b in rows], dtype=np.int64)
    got = merge_arrays(starts, ends)
    assert list(zip(got[0].tolist(), got[1].tolist())) == merge(rows)
    assert (got[0][1:] > got[1][:-1]).all()  # disjoint and never touching


@settings(max_examples=300, deadline=None)
@given(sorted_intervals, intervals)
def test_the_overlap_with_a_union_is_the_plain_intersection(rows, spans):
    starts = np.array([a for a, _ in rows], dtype=np.int64)
    ends = np.array([b for _, b in rows], dtype=np.int64)
    union = merge_arrays(starts, ends)
    query = merge(spans)
    found = overlap(query, union)
    assert found == length(intersect(query, merge(rows)))
    assert 0 <= found <= min(length(query), length(merge(rows)))  # an overlap never exceeds either side


@settings(max_examples=200, deadline=None)
@given(sorted_intervals, st.lists(st.integers(-10, BOUND + 10**9), max_size=20))
def test_the_covered_length_before_a_time_grows_with_it_and_stops_at_the_union(rows, times):
    union = merge_arrays(np.array([a for a, _ in rows], dtype=np.int64), np.array([b for _, b in rows], dtype=np.int64))
    times = sorted(times)
    covered = covered_before(union, times).tolist()
    assert covered == sorted(covered)  # never shrinks as time goes on
    assert all(0 <= c <= length(merge(rows)) for c in covered)
    assert covered == [length(intersect(merge(rows), [(-1, t)])) if t > -1 else 0 for t in times]
