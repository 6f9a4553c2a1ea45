import pytest
from units.format import sum_lengths, to_unit_text
from units.length import convert, parse_length
from units.temperature import c_to_f, f_to_c, is_freezing


def test_temperature_roundtrip():
  assert c_to_f(-40) == -40
  assert f_to_c(50) == 10
