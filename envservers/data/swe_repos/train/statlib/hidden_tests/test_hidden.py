import pytest

from statlib.core import mean, median, variance
from statlib.scale import clip_all, normalize
from statlib.util import check_numbers, clamp, moving_sum


def test_mean_empty():
  assert mean([]) == 0.0


def test_mean_values():
  assert mean([2, 4]) == 3
  assert mean([-1, 1, 3]) == 1


def test_mean_rejects_text():
  with pytest.raises(TypeError):
    mean([1, "2"])


def test_median_odd_even():
  assert median([9, 1, 5]) == 5
  assert median([1, 2, 3, 4, 5, 6]) == 3.5


def test_median_empty():
  with pytest.raises(ValueError):
    median([])


def test_variance_population_and_sample():
  assert variance([2, 4, 4, 4, 5, 5, 7, 9]) == 4
  assert variance([1, 3], ddof=1) == 2


def test_variance_too_few():
  with pytest.raises(ValueError):
    variance([1], ddof=1)


def test_clamp_edges():
  assert clamp(-2, 0, 1) == 0
  assert clamp(0.5, 0, 1) == 0.5
  assert clamp(1, 0, 1) == 1


def test_clip_all():
  assert clip_all([0, 10, 20], 5, 15) == [5, 10, 15]


def test_normalize_range_and_constant():
  assert normalize([0, 5, 10], lo=-1, hi=1) == [-1.0, 0.0, 1.0]
  assert normalize([3, 3]) == [0.0, 0.0]


def test_moving_sum_windows():
  assert moving_sum([1, 1, 1, 1, 1], window=2) == [2, 2, 2, 2]
  assert moving_sum([1, 2, 3]) == [6]


def test_check_numbers_names_item():
  with pytest.raises(TypeError, match="item 2"):
    check_numbers([1, 2, None])
