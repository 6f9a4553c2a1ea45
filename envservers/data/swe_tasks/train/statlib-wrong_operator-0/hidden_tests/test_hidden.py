import pytest
from statlib.core import mean, median, variance
from statlib.scale import clip_all, normalize
from statlib.util import check_numbers, clamp, moving_sum


def test_moving_sum_windows():
  assert moving_sum([1, 1, 1, 1, 1], window=2) == [2, 2, 2, 2]
  assert moving_sum([1, 2, 3]) == [6]
