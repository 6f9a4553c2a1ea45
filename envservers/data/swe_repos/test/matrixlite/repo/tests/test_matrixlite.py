from matrixlite.ops import add, matmul, transpose
from matrixlite.reduce import col_sums, row_sums, trace
from matrixlite.shape import identity, shape


def test_ops():
  a = [[1, 2], [3, 4]]
  assert add(a, a) == [[2, 4], [6, 8]]
  assert matmul(a, [[1], [1]]) == [[3], [7]]
  assert transpose([[1, 2, 3]]) == [[1], [2], [3]]


def test_shape_and_reduce():
  assert shape([[1, 2, 3]]) == (1, 3)
  assert identity(2) == [[1, 0], [0, 1]]
  assert row_sums([[1, 2], [3, 4]]) == [3, 7]
  assert col_sums([[1, 2], [3, 4]]) == [4, 6]
  assert trace([[1, 2], [3, 4]]) == 5
