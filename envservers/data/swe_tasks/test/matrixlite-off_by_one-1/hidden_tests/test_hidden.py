import pytest
from matrixlite.ops import add, matmul, transpose
from matrixlite.reduce import col_sums, row_sums, trace
from matrixlite.shape import check_same_shape, identity, shape


def test_matmul_rectangular():
  assert matmul([[1, 2, 3]], [[1], [0], [2]]) == [[7]]
  assert matmul([[1], [2]], [[3, 4]]) == [[3, 4], [6, 8]]
