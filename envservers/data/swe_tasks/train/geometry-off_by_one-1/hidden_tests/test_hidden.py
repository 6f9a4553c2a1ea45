from geometry.points import distance, manhattan, midpoint
from geometry.shapes import area, bounding_box, perimeter
from geometry.transform import centre_of_segment, scale_about, translate


def test_area_triangle_and_degenerate():
  assert area([(0, 0), (4, 0), (0, 3)]) == 6
  assert area([(0, 0), (1, 1)]) == 0.0


def test_area_clockwise():
  assert area([(0, 0), (0, 2), (3, 2), (3, 0)]) == 6
