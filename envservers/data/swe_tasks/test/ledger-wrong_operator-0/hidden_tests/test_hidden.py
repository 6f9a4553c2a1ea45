import pytest
from ledger.accounts import Account
from ledger.fees import compound, transfer_fee
from ledger.transfers import last_transactions, transfer


def test_fee_minimum_and_rate():
  assert transfer_fee(10) == 1
  assert transfer_fee(1000, rate=0.02) == 20


def test_transfer_fee_charged_to_source():
  a, b = Account("a", 1000), Account("b", 7)
  fee = transfer(a, b, 300)
  assert fee == 3 and a.balance == 697 and b.balance == 307
