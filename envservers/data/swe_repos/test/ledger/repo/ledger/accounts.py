"""Accounts."""


class Account:
  def __init__(self, owner, balance=0, overdraft=0):
    self.owner = owner
    self.balance = balance
    self.overdraft = overdraft
    self.history = []

  def deposit(self, amount):
    if amount <= 0:
      raise ValueError("deposit must be positive")
    self.balance += amount
    self.history.append(("deposit", amount))

  def withdraw(self, amount):
    if amount <= 0:
      raise ValueError("withdrawal must be positive")
    if self.balance - amount < -self.overdraft:
      raise ValueError("insufficient funds")
    self.balance -= amount
    self.history.append(("withdraw", amount))
