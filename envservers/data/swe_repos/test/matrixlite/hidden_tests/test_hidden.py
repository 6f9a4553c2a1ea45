import pytest

from matrixlite.ops import add, matmul, transpose
from matrixlite.reduce import col_sums, row_sums, trace
from matrixlite.shape import check_same_shape, identity, shape


def test_add_rejects_shapes():
  with pytest.raises(ValueError):
    add([[1]], [[1, 2]])


def test_matmul_rectangular():
  assert matmul([[1, 2, 3]], [[1], [0], [2]]) == [[7]]
  assert matmul([[1], [2]], [[3, 4]]) == [[3, 4], [6, 8]]


def test_matmul_inner_mismatch():
  with pytest.raises(ValueError):
    matmul([[1, 2]], [[1, 2]])


def test_transpose_square():
  assert transpose([[1, 2], [3, 4]]) == [[1, 3], [2, 4]]


def test_shape_empty():
  assert shape([]) == (0, 0)


def test_identity_value():
  assert identity(3, value=2)[1] == [0, 2, 0]


def test_col_sums_rectangular():
  assert col_sums([[1, 2, 3], [4, 5, 6]]) == [5, 7, 9]


def test_trace_rectangular():
  assert trace([[1, 2, 3], [4, 5, 6]]) == 6


def test_check_same_shape_ok():
  check_same_shape([[1, 2]], [[3, 4]])
