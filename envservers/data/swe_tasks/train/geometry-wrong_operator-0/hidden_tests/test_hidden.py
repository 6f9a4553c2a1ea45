from geometry.points import distance, manhattan, midpoint
from geometry.shapes import area, bounding_box, perimeter
from geometry.transform import centre_of_segment, scale_about, translate


def test_scale_about_origin_and_shrink():
  assert scale_about([(2, 4)], (0, 0), 0.5) == [(1, 2)]
  assert scale_about([(3, 3)], (1, 1), 2) == [(5, 5)]
