from geometry.points import distance, manhattan, midpoint
from geometry.shapes import area, bounding_box, perimeter
from geometry.transform import centre_of_segment, scale_about, translate


def test_points():
  assert distance((0, 0), (3, 4)) == 5
  assert midpoint((0, 0), (2, 4)) == (1, 2)
  assert manhattan((1, 1), (4, -1)) == 5


def test_shapes():
  square = [(0, 0), (2, 0), (2, 2), (0, 2)]
  assert perimeter(square) == 8
  assert area(square) == 4
  assert bounding_box([(1, 5), (-2, 3)]) == (-2, 3, 1, 5)


def test_transform():
  assert translate([(1, 1)], 2) == [(3, 1.0)]
  assert scale_about([(2, 2)], (1, 1), 3) == [(4, 4)]
  assert centre_of_segment(((0, 0), (4, 0))) == (2, 0)
