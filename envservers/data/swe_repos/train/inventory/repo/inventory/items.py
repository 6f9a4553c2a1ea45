"""Items and stock."""


class Stock:
  """Quantities by item name."""

  def __init__(self):
    self.counts = {}

  def add(self, name, quantity=1):
    if quantity <= 0:
      raise ValueError("quantity must be positive")
    self.counts[name] = self.counts.get(name, 0) + quantity

  def remove(self, name, quantity=1):
    have = self.counts.get(name, 0)
    if quantity > have:
      raise ValueError(f"only {have} of {name} in stock")
    self.counts[name] = have - quantity
    if self.counts[name] == 0:
      del self.counts[name]

  def total(self):
    return sum(self.counts.values())
