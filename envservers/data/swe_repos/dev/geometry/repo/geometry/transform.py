"""Moves."""
from geometry.points import midpoint


def translate(points, dx, dy=0.0):
  return [(x + dx, y + dy) for x, y in points]


def scale_about(points, center, factor):
  """Points scaled by `factor` about `center`."""
  cx, cy = center
  return [(cx + (x - cx) * factor, cy + (y - cy) * factor) for x, y in points]


def centre_of_segment(segment):
  return midpoint(segment[0], segment[1])
