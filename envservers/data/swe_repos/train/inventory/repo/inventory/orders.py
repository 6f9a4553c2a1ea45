"""Orders against a price list."""
from inventory.pricing import apply_discount, bulk_discount_percent, line_price


def order_total(prices, order):
  """Sum over (name, quantity) lines with each line's bulk discount."""
  total = 0.0
  for name, quantity in order:
    amount = line_price(prices[name], quantity)
    total += apply_discount(amount, bulk_discount_percent(quantity))
  return round(total, 2)


def fill_order(stock, order):
  """Removes the order from stock; nothing is removed if any line cannot be filled."""
  for name, quantity in order:
    if stock.counts.get(name, 0) < quantity:
      return False
  for name, quantity in order:
    stock.remove(name, quantity)
  return True
