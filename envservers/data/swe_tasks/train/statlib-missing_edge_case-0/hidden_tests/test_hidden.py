import pytest
from statlib.core import mean, median, variance
from statlib.scale import clip_all, normalize
from statlib.util import check_numbers, clamp, moving_sum


def test_clamp_edges():
  assert clamp(-2, 0, 1) == 0
  assert clamp(0.5, 0, 1) == 0.5
  assert clamp(1, 0, 1) == 1


def test_clip_all():
  assert clip_all([0, 10, 20], 5, 15) == [5, 10, 15]
