"""Formatting."""
from units.length import convert, parse_length


def to_unit_text(text, dst, digits=2):
  """'100 cm', 'm' -> '1.0 m'."""
  value, src = parse_length(text)
  return f"{round(convert(value, src, dst), digits)} {dst}"


def sum_lengths(texts, dst="m"):
  """Total of several lengths in unit `dst`."""
  total = 0.0
  for text in texts:
    value, src = parse_length(text)
    total += convert(value, src, dst)
  return round(total, 6)
