"""Checks and small transforms."""


def check_numbers(xs):
  """Raises TypeError if an item is not a number."""
  for i in range(len(xs)):
    if not isinstance(xs[i], (int, float)):
      raise TypeError(f"item {i} is not a number: {xs[i]!r}")


def clamp(x, lo, hi):
  """x limited to [lo, hi]."""
  if x < lo:
    return lo
  if x > hi:
    return hi
  return x


def moving_sum(xs, window=3):
  """Sums of each run of `window` consecutive values."""
  return [sum(xs[i:i + window]) for i in range(len(xs) - window + 1)]
