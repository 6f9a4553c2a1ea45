import pytest
from units.format import sum_lengths, to_unit_text
from units.length import convert, parse_length
from units.temperature import c_to_f, f_to_c, is_freezing


def test_to_unit_text_digits():
  assert to_unit_text("1 in", "cm", digits=1) == "2.5 cm"
