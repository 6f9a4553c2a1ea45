from geometry.points import distance, manhattan, midpoint
from geometry.shapes import area, bounding_box, perimeter
from geometry.transform import centre_of_segment, scale_about, translate


def test_distance_negative():
  assert distance((-1, -1), (2, 3)) == 5


def test_midpoint_fractional():
  assert midpoint((1, 1), (2, 2)) == (1.5, 1.5)


def test_manhattan_symmetric():
  assert manhattan((0, 0), (-3, 2)) == manhattan((-3, 2), (0, 0)) == 5


def test_perimeter_open_and_closed():
  path = [(0, 0), (3, 0), (3, 4)]
  assert perimeter(path, closed=False) == 7
  assert perimeter(path) == 12


def test_perimeter_two_points():
  assert perimeter([(0, 0), (0, 5)]) == 5


def test_area_triangle_and_degenerate():
  assert area([(0, 0), (4, 0), (0, 3)]) == 6
  assert area([(0, 0), (1, 1)]) == 0.0


def test_area_clockwise():
  assert area([(0, 0), (0, 2), (3, 2), (3, 0)]) == 6


def test_bounding_box_single():
  assert bounding_box([(2, 3)]) == (2, 3, 2, 3)


def test_translate_both_axes():
  assert translate([(0, 0), (1, 2)], 1, -1) == [(1, -1), (2, 1)]


def test_scale_about_origin_and_shrink():
  assert scale_about([(2, 4)], (0, 0), 0.5) == [(1, 2)]
  assert scale_about([(3, 3)], (1, 1), 2) == [(5, 5)]


def test_centre_of_vertical_segment():
  assert centre_of_segment(((1, 0), (1, 6))) == (1, 3)
