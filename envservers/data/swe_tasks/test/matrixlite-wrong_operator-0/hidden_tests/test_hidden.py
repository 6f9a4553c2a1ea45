import pytest
from matrixlite.ops import add, matmul, transpose
from matrixlite.reduce import col_sums, row_sums, trace
from matrixlite.shape import check_same_shape, identity, shape


def test_add_rejects_shapes():
  with pytest.raises(ValueError):
    add([[1]], [[1, 2]])


def test_check_same_shape_ok():
  check_same_shape([[1, 2]], [[3, 4]])
