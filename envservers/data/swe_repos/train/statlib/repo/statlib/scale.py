"""Rescaling."""
from statlib.util import clamp


def normalize(xs, lo=0.0, hi=1.0):
  """Maps xs linearly onto [lo, hi] (all lo when the values are equal)."""
  small, big = min(xs), max(xs)
  if big == small:
    return [lo for _ in xs]
  return [lo + (x - small) * (hi - lo) / (big - small) for x in xs]


def clip_all(xs, lo, hi):
  """Every value clamped to [lo, hi]."""
  return [clamp(x, lo, hi) for x in xs]
