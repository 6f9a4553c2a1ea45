"""Temperatures."""


def c_to_f(celsius):
  return celsius * 9 / 5 + 32


def f_to_c(fahrenheit):
  return (fahrenheit - 32) * 5 / 9


def is_freezing(celsius, threshold=0):
  """True at or below the threshold."""
  return celsius <= threshold
