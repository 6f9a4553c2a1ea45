import pytest

from ledger.accounts import Account
from ledger.fees import compound, transfer_fee
from ledger.transfers import last_transactions, transfer


def test_default_balance():
  assert Account("x").balance == 0


def test_deposit_rejects_zero():
  with pytest.raises(ValueError):
    Account("x").deposit(0)


def test_withdraw_to_overdraft_limit():
  a = Account("x", 10, overdraft=5)
  a.withdraw(15)
  assert a.balance == -5
  with pytest.raises(ValueError):
    a.withdraw(1)


def test_withdraw_exact_balance():
  a = Account("x", 10)
  a.withdraw(10)
  assert a.balance == 0


def test_fee_minimum_and_rate():
  assert transfer_fee(10) == 1
  assert transfer_fee(1000, rate=0.02) == 20


def test_compound_zero_years():
  assert compound(50, 0.5, 0) == 50
  assert compound(100, 0.5, 3) == 337.5


def test_transfer_fee_charged_to_source():
  a, b = Account("a", 1000), Account("b", 7)
  fee = transfer(a, b, 300)
  assert fee == 3 and a.balance == 697 and b.balance == 307


def test_last_transactions_order_and_n():
  a = Account("a")
  for amount in (1, 2, 3, 4):
    a.deposit(amount)
  assert last_transactions(a, 2) == [("deposit", 4), ("deposit", 3)]
  assert len(last_transactions(a)) == 3
