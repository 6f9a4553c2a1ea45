from geometry.points import distance, manhattan, midpoint
from geometry.shapes import area, bounding_box, perimeter
from geometry.transform import centre_of_segment, scale_about, translate


def test_midpoint_fractional():
  assert midpoint((1, 1), (2, 2)) == (1.5, 1.5)


def test_centre_of_vertical_segment():
  assert centre_of_segment(((1, 0), (1, 6))) == (1, 3)
