from geometry.points import distance, manhattan, midpoint
from geometry.shapes import area, bounding_box, perimeter
from geometry.transform import centre_of_segment, scale_about, translate


def test_perimeter_open_and_closed():
  path = [(0, 0), (3, 0), (3, 4)]
  assert perimeter(path, closed=False) == 7
  assert perimeter(path) == 12


def test_perimeter_two_points():
  assert perimeter([(0, 0), (0, 5)]) == 5
