import pytest
from ledger.accounts import Account
from ledger.fees import compound, transfer_fee
from ledger.transfers import last_transactions, transfer


def test_default_balance():
  assert Account("x").balance == 0
