import pytest
from statlib.core import mean, median, variance
from statlib.scale import clip_all, normalize
from statlib.util import check_numbers, clamp, moving_sum


def test_normalize_range_and_constant():
  assert normalize([0, 5, 10], lo=-1, hi=1) == [-1.0, 0.0, 1.0]
  assert normalize([3, 3]) == [0.0, 0.0]
