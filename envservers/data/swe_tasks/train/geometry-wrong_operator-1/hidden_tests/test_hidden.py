from geometry.points import distance, manhattan, midpoint
from geometry.shapes import area, bounding_box, perimeter
from geometry.transform import centre_of_segment, scale_about, translate


def test_manhattan_symmetric():
  assert manhattan((0, 0), (-3, 2)) == manhattan((-3, 2), (0, 0)) == 5
