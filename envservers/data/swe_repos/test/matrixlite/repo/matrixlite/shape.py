"""Shapes."""


def shape(a):
  """(rows, cols); (0, 0) for an empty matrix."""
  if not a:
    return (0, 0)
  return (len(a), len(a[0]))


def check_same_shape(a, b):
  if shape(a) != shape(b):
    raise ValueError(f"shapes differ: {shape(a)} vs {shape(b)}")


def identity(n, value=1):
  return [[value if i == j else 0 for j in range(n)] for i in range(n)]
