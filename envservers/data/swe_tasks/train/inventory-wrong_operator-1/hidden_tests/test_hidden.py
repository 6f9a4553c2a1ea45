import pytest
from inventory.items import Stock
from inventory.orders import fill_order, order_total
from inventory.pricing import apply_discount, bulk_discount_percent, line_price


def test_remove_all_deletes():
  s = Stock()
  s.add("cup", 2)
  s.remove("cup", 2)
  assert s.counts == {} and s.total() == 0


def test_fill_order_all_or_nothing():
  s = Stock()
  s.add("a", 1)
  s.add("b", 5)
  assert not fill_order(s, [("b", 2), ("a", 2)])
  assert s.counts == {"a": 1, "b": 5}
  assert fill_order(s, [("a", 1)]) and s.counts == {"b": 5}
