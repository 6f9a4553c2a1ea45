import pytest
from units.format import sum_lengths, to_unit_text
from units.length import convert, parse_length
from units.temperature import c_to_f, f_to_c, is_freezing


def test_sum_lengths_other_unit():
  assert sum_lengths(["1 km", "500 m"], dst="km") == 1.5
