"""Points and distances."""
import math


def distance(p, q):
  """Euclidean distance between points p and q."""
  return math.hypot(q[0] - p[0], q[1] - p[1])


def midpoint(p, q):
  return ((p[0] + q[0]) / 2, (p[1] + q[1]) / 2)


def manhattan(p, q):
  return abs(q[0] - p[0]) + abs(q[1] - p[1])
