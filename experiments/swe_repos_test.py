"""Source of the held-out repositories of the SWE test split (none shared with training); see
swe_repos_train.py for the layout."""

LEDGER = {
    "ledger/__init__.py": '"""Accounts and transfers."""\n',
    "ledger/accounts.py": '''"""Accounts."""


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
''',
    "ledger/transfers.py": '''"""Moving money."""
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
''',
    "ledger/fees.py": '''"""Fees and interest."""


def transfer_fee(amount, rate=0.01, minimum=1):
  """A `rate` share of the amount, at least `minimum`."""
  return max(minimum, round(amount * rate, 2))


def compound(balance, rate, years):
  """Balance after `years` of yearly compounding at `rate`."""
  for _ in range(years):
    balance = balance * (1 + rate)
  return round(balance, 2)
''',
    "tests/test_ledger.py": '''from ledger.accounts import Account
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
''',
}

LEDGER_HIDDEN = '''import pytest

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
'''

UNITS = {
    "units/__init__.py": '"""Unit conversions."""\n',
    "units/length.py": '''"""Lengths."""

FACTORS = {"mm": 0.001, "cm": 0.01, "m": 1.0, "km": 1000.0, "in": 0.0254, "ft": 0.3048}


def convert(value, src, dst):
  """`value` in unit `src` expressed in unit `dst`."""
  if src not in FACTORS or dst not in FACTORS:
    raise KeyError(f"unknown unit {src if src not in FACTORS else dst}")
  return value * FACTORS[src] / FACTORS[dst]


def parse_length(text):
  """'12.5 cm' -> (12.5, 'cm')."""
  number, unit = text.split()
  return float(number), unit
''',
    "units/temperature.py": '''"""Temperatures."""


def c_to_f(celsius):
  return celsius * 9 / 5 + 32


def f_to_c(fahrenheit):
  return (fahrenheit - 32) * 5 / 9


def is_freezing(celsius, threshold=0):
  """True at or below the threshold."""
  return celsius <= threshold
''',
    "units/format.py": '''"""Formatting."""
from units.length import convert, parse_length


def to_unit_text(text, dst, digits=2):
  """'100 cm', 'm' -> '1.0 m'."""
  value, src = parse_length(text)
  return f"{round(convert(value, src, dst), digits)} {dst}"


def sum_lengths(texts, dst="m"):
  """Total of several lengths in unit `dst`."""
  total = 0.0
  for text in texts:
    value, src = parse_length(text)
    total += convert(value, src, dst)
  return round(total, 6)
''',
    "tests/test_units.py": '''from units.format import sum_lengths, to_unit_text
from units.length import convert
from units.temperature import c_to_f, f_to_c, is_freezing


def test_length():
  assert convert(2, "km", "m") == 2000
  assert to_unit_text("150 cm", "m") == "1.5 m"
  assert sum_lengths(["1 m", "50 cm"]) == 1.5


def test_temperature():
  assert c_to_f(100) == 212
  assert f_to_c(212) == 100
  assert is_freezing(-3)
''',
}

UNITS_HIDDEN = '''import pytest

from units.format import sum_lengths, to_unit_text
from units.length import convert, parse_length
from units.temperature import c_to_f, f_to_c, is_freezing


def test_convert_small_to_large():
  assert convert(2500, "mm", "m") == 2.5


def test_convert_imperial():
  assert round(convert(1, "ft", "in"), 6) == 12


def test_convert_unknown_unit():
  with pytest.raises(KeyError):
    convert(1, "m", "mile")


def test_parse_length():
  assert parse_length("3 km") == (3.0, "km")


def test_to_unit_text_digits():
  assert to_unit_text("1 in", "cm", digits=1) == "2.5 cm"


def test_sum_lengths_other_unit():
  assert sum_lengths(["1 km", "500 m"], dst="km") == 1.5


def test_temperature_roundtrip():
  assert c_to_f(-40) == -40
  assert f_to_c(50) == 10


def test_freezing_threshold():
  assert is_freezing(0)
  assert not is_freezing(1)
  assert is_freezing(4, threshold=4)
'''

MATRIXLITE = {
    "matrixlite/__init__.py": '"""Lists-of-lists matrices."""\n',
    "matrixlite/ops.py": '''"""Basic operations."""
from matrixlite.shape import check_same_shape, shape


def add(a, b):
  check_same_shape(a, b)
  return [[a[i][j] + b[i][j] for j in range(len(a[0]))] for i in range(len(a))]


def matmul(a, b):
  """a (n x k) times b (k x m)."""
  n, k = shape(a)
  k2, m = shape(b)
  if k != k2:
    raise ValueError(f"inner sizes differ: {k} vs {k2}")
  return [[sum(a[i][t] * b[t][j] for t in range(k)) for j in range(m)] for i in range(n)]


def transpose(a):
  rows, cols = shape(a)
  return [[a[i][j] for i in range(rows)] for j in range(cols)]
''',
    "matrixlite/shape.py": '''"""Shapes."""


def shape(a):
  """(rows, cols); (0, 0) for an empty matrix."""
  if not a:
    return (0, 0)
  return (len(a), len(a[0]))


def check_same_shape(a, b):
  if shape(a) != shape(b):
    raise ValueError(f"shapes differ: {shape(a)} vs {shape(b)}")


def identity(n, value=1):
  return [[value if i == j else 0 for j in range(n)] for i in range(n)]
''',
    "matrixlite/reduce.py": '''"""Reductions."""
from matrixlite.ops import transpose


def row_sums(a):
  return [sum(row) for row in a]


def col_sums(a):
  return row_sums(transpose(a))


def trace(a):
  """Sum of the diagonal."""
  return sum(a[i][i] for i in range(min(len(a), len(a[0]))))
''',
    "tests/test_matrixlite.py": '''from matrixlite.ops import add, matmul, transpose
from matrixlite.reduce import col_sums, row_sums, trace
from matrixlite.shape import identity, shape


def test_ops():
  a = [[1, 2], [3, 4]]
  assert add(a, a) == [[2, 4], [6, 8]]
  assert matmul(a, [[1], [1]]) == [[3], [7]]
  assert transpose([[1, 2, 3]]) == [[1], [2], [3]]


def test_shape_and_reduce():
  assert shape([[1, 2, 3]]) == (1, 3)
  assert identity(2) == [[1, 0], [0, 1]]
  assert row_sums([[1, 2], [3, 4]]) == [3, 7]
  assert col_sums([[1, 2], [3, 4]]) == [4, 6]
  assert trace([[1, 2], [3, 4]]) == 5
''',
}

MATRIXLITE_HIDDEN = '''import pytest

from matrixlite.ops import add, matmul, transpose
from matrixlite.reduce import col_sums, row_sums, trace
from matrixlite.shape import check_same_shape, identity, shape


def test_add_rejects_shapes():
  with pytest.raises(ValueError):
    add([[1]], [[1, 2]])


def test_matmul_rectangular():
  assert matmul([[1, 2, 3]], [[1], [0], [2]]) == [[7]]
  assert matmul([[1], [2]], [[3, 4]]) == [[3, 4], [6, 8]]


def test_matmul_inner_mismatch():
  with pytest.raises(ValueError):
    matmul([[1, 2]], [[1, 2]])


def test_transpose_square():
  assert transpose([[1, 2], [3, 4]]) == [[1, 3], [2, 4]]


def test_shape_empty():
  assert shape([]) == (0, 0)


def test_identity_value():
  assert identity(3, value=2)[1] == [0, 2, 0]


def test_col_sums_rectangular():
  assert col_sums([[1, 2, 3], [4, 5, 6]]) == [5, 7, 9]


def test_trace_rectangular():
  assert trace([[1, 2, 3], [4, 5, 6]]) == 6


def test_check_same_shape_ok():
  check_same_shape([[1, 2]], [[3, 4]])
'''

REPOS = {"ledger": (LEDGER, LEDGER_HIDDEN), "units": (UNITS, UNITS_HIDDEN),
         "matrixlite": (MATRIXLITE, MATRIXLITE_HIDDEN)}
