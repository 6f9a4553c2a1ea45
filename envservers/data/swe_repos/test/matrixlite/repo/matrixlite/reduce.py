"""Reductions."""
from matrixlite.ops import transpose


def row_sums(a):
  return [sum(row) for row in a]


def col_sums(a):
  return row_sums(transpose(a))


def trace(a):
  """Sum of the diagonal."""
  return sum(a[i][i] for i in range(min(len(a), len(a[0]))))
