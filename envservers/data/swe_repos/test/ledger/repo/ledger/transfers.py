"""Moving money."""
from ledger.fees import transfer_fee


def transfer(source, target, amount):
  """Moves `amount` from source to target; the fee is charged to the source."""
  fee = transfer_fee(amount)
  source.withdraw(amount + fee)
  target.deposit(amount)
  return fee


def last_transactions(account, n=3):
  """The account's n most recent history entries, newest first."""
  return list(reversed(account.history))[:n]
