import pytest
from statlib.core import mean, median, variance
from statlib.scale import clip_all, normalize
from statlib.util import check_numbers, clamp, moving_sum


def test_variance_population_and_sample():
  assert variance([2, 4, 4, 4, 5, 5, 7, 9]) == 4
  assert variance([1, 3], ddof=1) == 2
