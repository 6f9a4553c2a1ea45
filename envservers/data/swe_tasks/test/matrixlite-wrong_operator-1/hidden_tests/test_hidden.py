import pytest
from matrixlite.ops import add, matmul, transpose
from matrixlite.reduce import col_sums, row_sums, trace
from matrixlite.shape import check_same_shape, identity, shape


def test_identity_value():
  assert identity(3, value=2)[1] == [0, 2, 0]
