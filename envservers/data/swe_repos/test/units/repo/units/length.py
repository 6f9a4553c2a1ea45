"""Lengths."""

FACTORS = {"mm": 0.001, "cm": 0.01, "m": 1.0, "km": 1000.0, "in": 0.0254, "ft": 0.3048}


def convert(value, src, dst):
  """`value` in unit `src` expressed in unit `dst`."""
  if src not in FACTORS or dst not in FACTORS:
    raise KeyError(f"unknown unit {src if src not in FACTORS else dst}")
  return value * FACTORS[src] / FACTORS[dst]


def parse_length(text):
  """'12.5 cm' -> (12.5, 'cm')."""
  number, unit = text.split()
  return float(number), unit
