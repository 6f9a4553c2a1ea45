import pytest

from inventory.items import Stock
from inventory.orders import fill_order, order_total
from inventory.pricing import apply_discount, bulk_discount_percent, line_price


def test_add_default_quantity():
  s = Stock()
  s.add("cup")
  assert s.counts == {"cup": 1}


def test_add_rejects_zero():
  with pytest.raises(ValueError):
    Stock().add("cup", 0)


def test_remove_all_deletes():
  s = Stock()
  s.add("cup", 2)
  s.remove("cup", 2)
  assert s.counts == {} and s.total() == 0


def test_remove_too_many():
  s = Stock()
  s.add("cup", 1)
  with pytest.raises(ValueError):
    s.remove("cup", 2)


def test_line_price():
  assert line_price(2.5, 4) == 10.0


def test_discount_bounds():
  assert apply_discount(80.0, 0) == 80.0
  assert apply_discount(80.0, 100) == 0.0
  with pytest.raises(ValueError):
    apply_discount(1.0, 101)


def test_bulk_thresholds():
  assert bulk_discount_percent(9) == 0
  assert bulk_discount_percent(49) == 5
  assert bulk_discount_percent(50) == 10


def test_order_total_bulk():
  assert order_total({"a": 1.0}, [("a", 50)]) == 45.0
  assert order_total({"a": 3.0, "b": 1.0}, [("a", 1), ("b", 2)]) == 5.0


def test_fill_order_all_or_nothing():
  s = Stock()
  s.add("a", 1)
  s.add("b", 5)
  assert not fill_order(s, [("b", 2), ("a", 2)])
  assert s.counts == {"a": 1, "b": 5}
  assert fill_order(s, [("a", 1)]) and s.counts == {"b": 5}
