import pytest
from inventory.items import Stock
from inventory.orders import fill_order, order_total
from inventory.pricing import apply_discount, bulk_discount_percent, line_price


def test_bulk_thresholds():
  assert bulk_discount_percent(9) == 0
  assert bulk_discount_percent(49) == 5
  assert bulk_discount_percent(50) == 10
