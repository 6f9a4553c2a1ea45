import pytest
from statlib.core import mean, median, variance
from statlib.scale import clip_all, normalize
from statlib.util import check_numbers, clamp, moving_sum


def test_median_odd_even():
  assert median([9, 1, 5]) == 5
  assert median([1, 2, 3, 4, 5, 6]) == 3.5
