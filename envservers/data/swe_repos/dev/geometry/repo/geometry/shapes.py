"""Polygons."""
from geometry.points import distance


def perimeter(points, closed=True):
  """Length of the path through the points (back to the first when closed)."""
  total = 0.0
  for i in range(len(points) - 1):
    total += distance(points[i], points[i + 1])
  if closed and len(points) > 2:
    total += distance(points[-1], points[0])
  return total


def area(points):
  """Polygon area by the shoelace formula (0 for fewer than 3 points)."""
  if len(points) < 3:
    return 0.0
  s = 0.0
  for i in range(len(points)):
    x1, y1 = points[i]
    x2, y2 = points[(i + 1) % len(points)]
    s += x1 * y2 - x2 * y1
  return abs(s) / 2


def bounding_box(points):
  """(min x, min y, max x, max y)."""
  xs = [p[0] for p in points]
  ys = [p[1] for p in points]
  return (min(xs), min(ys), max(xs), max(ys))
