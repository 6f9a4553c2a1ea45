from ledger.accounts import Account
from ledger.fees import compound, transfer_fee
from ledger.transfers import last_transactions, transfer


def test_account():
  a = Account("ann", 10)
  a.deposit(5)
  a.withdraw(3)
  assert a.balance == 12


def test_fees():
  assert transfer_fee(500) == 5
  assert compound(100, 0.1, 2) == 121.0


def test_transfer():
  a, b = Account("a", 200), Account("b")
  assert transfer(a, b, 100) == 1
  assert (a.balance, b.balance) == (99, 100)
  assert last_transactions(a) == [("withdraw", 101)]
