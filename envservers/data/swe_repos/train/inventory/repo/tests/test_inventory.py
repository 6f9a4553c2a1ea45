from inventory.items import Stock
from inventory.orders import fill_order, order_total
from inventory.pricing import apply_discount, bulk_discount_percent


def test_stock():
  s = Stock()
  s.add("pen", 3)
  s.remove("pen", 2)
  assert s.counts == {"pen": 1} and s.total() == 1


def test_pricing():
  assert apply_discount(200.0) == 180.0
  assert bulk_discount_percent(10) == 5


def test_orders():
  prices = {"pen": 2.0, "pad": 5.0}
  assert order_total(prices, [("pen", 10), ("pad", 1)]) == 24.0
  s = Stock()
  s.add("pen", 5)
  assert fill_order(s, [("pen", 2)]) and s.counts == {"pen": 3}
