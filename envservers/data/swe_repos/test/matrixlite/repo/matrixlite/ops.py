"""Basic operations."""
from matrixlite.shape import check_same_shape, shape


def add(a, b):
  check_same_shape(a, b)
  return [[a[i][j] + b[i][j] for j in range(len(a[0]))] for i in range(len(a))]


def matmul(a, b):
  """a (n x k) times b (k x m)."""
  n, k = shape(a)
  k2, m = shape(b)
  if k != k2:
    raise ValueError(f"inner sizes differ: {k} vs {k2}")
  return [[sum(a[i][t] * b[t][j] for t in range(k)) for j in range(m)] for i in range(n)]


def transpose(a):
  rows, cols = shape(a)
  return [[a[i][j] for i in range(rows)] for j in range(cols)]
