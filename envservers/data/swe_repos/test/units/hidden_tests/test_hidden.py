import pytest

from units.format import sum_lengths, to_unit_text
from units.length import convert, parse_length
from units.temperature import c_to_f, f_to_c, is_freezing


def test_convert_small_to_large():
  assert convert(2500, "mm", "m") == 2.5


def test_convert_imperial():
  assert round(convert(1, "ft", "in"), 6) == 12


def test_convert_unknown_unit():
  with pytest.raises(KeyError):
    convert(1, "m", "mile")


def test_parse_length():
  assert parse_length("3 km") == (3.0, "km")


def test_to_unit_text_digits():
  assert to_unit_text("1 in", "cm", digits=1) == "2.5 cm"


def test_sum_lengths_other_unit():
  assert sum_lengths(["1 km", "500 m"], dst="km") == 1.5


def test_temperature_roundtrip():
  assert c_to_f(-40) == -40
  assert f_to_c(50) == 10


def test_freezing_threshold():
  assert is_freezing(0)
  assert not is_freezing(1)
  assert is_freezing(4, threshold=4)
