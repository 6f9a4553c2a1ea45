import pytest
from matrixlite.ops import add, matmul, transpose
from matrixlite.reduce import col_sums, row_sums, trace
from matrixlite.shape import check_same_shape, identity, shape


def test_transpose_square():
  assert transpose([[1, 2], [3, 4]]) == [[1, 3], [2, 4]]


def test_col_sums_rectangular():
  assert col_sums([[1, 2, 3], [4, 5, 6]]) == [5, 7, 9]
