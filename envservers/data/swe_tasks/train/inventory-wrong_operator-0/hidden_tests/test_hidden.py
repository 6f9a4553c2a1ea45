import pytest
from inventory.items import Stock
from inventory.orders import fill_order, order_total
from inventory.pricing import apply_discount, bulk_discount_percent, line_price


def test_discount_bounds():
  assert apply_discount(80.0, 0) == 80.0
  assert apply_discount(80.0, 100) == 0.0
  with pytest.raises(ValueError):
    apply_discount(1.0, 101)


def test_order_total_bulk():
  assert order_total({"a": 1.0}, [("a", 50)]) == 45.0
  assert order_total({"a": 3.0, "b": 1.0}, [("a", 1), ("b", 2)]) == 5.0
