from statlib.core import mean, median, variance
from statlib.scale import clip_all, normalize
from statlib.util import clamp, moving_sum


def test_mean_and_median():
  assert mean([1, 2, 3, 6]) == 3
  assert median([5, 1, 3]) == 3
  assert median([4, 1, 3, 2]) == 2.5


def test_variance():
  assert variance([1, 2, 3, 4]) == 1.25
  assert variance([1, 2, 3, 4], ddof=1) == 5 / 3


def test_clamp_and_clip():
  assert clamp(5, 0, 3) == 3
  assert clip_all([-1, 2, 9], 0, 5) == [0, 2, 5]


def test_normalize_and_moving_sum():
  assert normalize([2, 4, 6]) == [0.0, 0.5, 1.0]
  assert moving_sum([1, 2, 3, 4]) == [6, 9]
