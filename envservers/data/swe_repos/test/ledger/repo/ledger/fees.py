"""Fees and interest."""


def transfer_fee(amount, rate=0.01, minimum=1):
  """A `rate` share of the amount, at least `minimum`."""
  return max(minimum, round(amount * rate, 2))


def compound(balance, rate, years):
  """Balance after `years` of yearly compounding at `rate`."""
  for _ in range(years):
    balance = balance * (1 + rate)
  return round(balance, 2)
