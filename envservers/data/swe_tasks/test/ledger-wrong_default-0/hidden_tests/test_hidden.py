import pytest
from ledger.accounts import Account
from ledger.fees import compound, transfer_fee
from ledger.transfers import last_transactions, transfer


def test_fee_minimum_and_rate():
  assert transfer_fee(10) == 1
  assert transfer_fee(1000, rate=0.02) == 20
