"""Prices and discounts."""


def line_price(unit_price, quantity):
  """Price of `quantity` units."""
  return unit_price * quantity


def apply_discount(amount, percent=10):
  """`amount` less `percent` percent, rounded to cents."""
  if percent < 0 or percent > 100:
    raise ValueError("percent must be in [0, 100]")
  return round(amount * (100 - percent) / 100, 2)


def bulk_discount_percent(quantity):
  """5 % from 10 units, 10 % from 50."""
  if quantity >= 50:
    return 10
  if quantity >= 10:
    return 5
  return 0
