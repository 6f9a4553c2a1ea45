from units.format import sum_lengths, to_unit_text
from units.length import convert
from units.temperature import c_to_f, f_to_c, is_freezing


def test_length():
  assert convert(2, "km", "m") == 2000
  assert to_unit_text("150 cm", "m") == "1.5 m"
  assert sum_lengths(["1 m", "50 cm"]) == 1.5


def test_temperature():
  assert c_to_f(100) == 212
  assert f_to_c(212) == 100
  assert is_freezing(-3)
