import pytest
from ledger.accounts import Account
from ledger.fees import compound, transfer_fee
from ledger.transfers import last_transactions, transfer


def test_compound_zero_years():
  assert compound(50, 0.5, 0) == 50
  assert compound(100, 0.5, 3) == 337.5
