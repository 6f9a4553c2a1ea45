"""Central tendency and spread."""
from statlib.util import check_numbers


def mean(xs):
  """The arithmetic mean; 0.0 for an empty list."""
  if not xs:
    return 0.0
  check_numbers(xs)
  return sum(xs) / len(xs)


def median(xs):
  """The middle value (the mean of the two middle values for an even count)."""
  if not xs:
    raise ValueError("median of an empty list")
  ordered = sorted(xs)
  mid = len(ordered) // 2
  if len(ordered) % 2 == 1:
    return ordered[mid]
  return (ordered[mid - 1] + ordered[mid]) / 2


def variance(xs, ddof=0):
  """Mean squared deviation, divided by len(xs) - ddof."""
  if len(xs) <= ddof:
    raise ValueError("not enough values")
  m = mean(xs)
  return sum((x - m) ** 2 for x in xs) / (len(xs) - ddof)
