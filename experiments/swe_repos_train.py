"""Source of the small Python repositories the SWE training tasks are made from.

Each repository: {path: source}, a package of 2-4 modules, its visible tests under tests/ and
a hidden test file (HIDDEN) whose failing tests become each task's hidden tests. Bugs are
generated from these sources by experiments/make_swe_tasks.py.
"""

STATLIB = {
    "statlib/__init__.py": '"""Small statistics helpers."""\n',
    "statlib/core.py": '''"""Central tendency and spread."""
from statlib.util import check_numbers


def mean(xs):
  """The arithmetic mean; 0.0 for an empty list."""
  if not xs:
    return 0.0
  check_numbers(xs)
  return sum(xs) / len(xs)


def median(xs):
  """The middle value (the mean of the two middle values for an even count)."""
  if not xs:
    raise ValueError("median of an empty list")
  ordered = sorted(xs)
  mid = len(ordered) // 2
  if len(ordered) % 2 == 1:
    return ordered[mid]
  return (ordered[mid - 1] + ordered[mid]) / 2


def variance(xs, ddof=0):
  """Mean squared deviation, divided by len(xs) - ddof."""
  if len(xs) <= ddof:
    raise ValueError("not enough values")
  m = mean(xs)
  return sum((x - m) ** 2 for x in xs) / (len(xs) - ddof)
''',
    "statlib/util.py": '''"""Checks and small transforms."""


def check_numbers(xs):
  """Raises TypeError if an item is not a number."""
  for i in range(len(xs)):
    if not isinstance(xs[i], (int, float)):
      raise TypeError(f"item {i} is not a number: {xs[i]!r}")


def clamp(x, lo, hi):
  """x limited to [lo, hi]."""
  if x < lo:
    return lo
  if x > hi:
    return hi
  return x


def moving_sum(xs, window=3):
  """Sums of each run of `window` consecutive values."""
  return [sum(xs[i:i + window]) for i in range(len(xs) - window + 1)]
''',
    "statlib/scale.py": '''"""Rescaling."""
from statlib.util import clamp


def normalize(xs, lo=0.0, hi=1.0):
  """Maps xs linearly onto [lo, hi] (all lo when the values are equal)."""
  small, big = min(xs), max(xs)
  if big == small:
    return [lo for _ in xs]
  return [lo + (x - small) * (hi - lo) / (big - small) for x in xs]


def clip_all(xs, lo, hi):
  """Every value clamped to [lo, hi]."""
  return [clamp(x, lo, hi) for x in xs]
''',
    "tests/test_statlib.py": '''from statlib.core import mean, median, variance
from statlib.scale import clip_all, normalize
from statlib.util import clamp, moving_sum


def test_mean_and_median():
  assert mean([1, 2, 3, 6]) == 3
  assert median([5, 1, 3]) == 3
  assert median([4, 1, 3, 2]) == 2.5


def test_variance():
  assert variance([1, 2, 3, 4]) == 1.25
  assert variance([1, 2, 3, 4], ddof=1) == 5 / 3


def test_clamp_and_clip():
  assert clamp(5, 0, 3) == 3
  assert clip_all([-1, 2, 9], 0, 5) == [0, 2, 5]


def test_normalize_and_moving_sum():
  assert normalize([2, 4, 6]) == [0.0, 0.5, 1.0]
  assert moving_sum([1, 2, 3, 4]) == [6, 9]
''',
}

STATLIB_HIDDEN = '''import pytest

from statlib.core import mean, median, variance
from statlib.scale import clip_all, normalize
from statlib.util import check_numbers, clamp, moving_sum


def test_mean_empty():
  assert mean([]) == 0.0


def test_mean_values():
  assert mean([2, 4]) == 3
  assert mean([-1, 1, 3]) == 1


def test_mean_rejects_text():
  with pytest.raises(TypeError):
    mean([1, "2"])


def test_median_odd_even():
  assert median([9, 1, 5]) == 5
  assert median([1, 2, 3, 4, 5, 6]) == 3.5


def test_median_empty():
  with pytest.raises(ValueError):
    median([])


def test_variance_population_and_sample():
  assert variance([2, 4, 4, 4, 5, 5, 7, 9]) == 4
  assert variance([1, 3], ddof=1) == 2


def test_variance_too_few():
  with pytest.raises(ValueError):
    variance([1], ddof=1)


def test_clamp_edges():
  assert clamp(-2, 0, 1) == 0
  assert clamp(0.5, 0, 1) == 0.5
  assert clamp(1, 0, 1) == 1


def test_clip_all():
  assert clip_all([0, 10, 20], 5, 15) == [5, 10, 15]


def test_normalize_range_and_constant():
  assert normalize([0, 5, 10], lo=-1, hi=1) == [-1.0, 0.0, 1.0]
  assert normalize([3, 3]) == [0.0, 0.0]


def test_moving_sum_windows():
  assert moving_sum([1, 1, 1, 1, 1], window=2) == [2, 2, 2, 2]
  assert moving_sum([1, 2, 3]) == [6]


def test_check_numbers_names_item():
  with pytest.raises(TypeError, match="item 2"):
    check_numbers([1, 2, None])
'''

TEXTKIT = {
    "textkit/__init__.py": '"""Text utilities."""\n',
    "textkit/words.py": '''"""Words and counting."""
from textkit.clean import normalize_space


def split_words(text, lower=True):
  """The words of `text` (split on whitespace, punctuation stripped)."""
  text = normalize_space(text)
  words = [w.strip(".,;:!?") for w in text.split(" ")]
  words = [w for w in words if w]
  if lower:
    return [w.lower() for w in words]
  return words


def word_counts(text):
  """{word: count} of the lower-cased words."""
  counts = {}
  for word in split_words(text):
    counts[word] = counts.get(word, 0) + 1
  return counts


def top_words(text, n=2):
  """The n most frequent words (ties broken alphabetically)."""
  counts = word_counts(text)
  ranked = sorted(counts, key=lambda w: (-counts[w], w))
  return ranked[:n]
''',
    "textkit/clean.py": '''"""Cleaning."""


def normalize_space(text):
  """Runs of whitespace collapsed to one space, ends stripped."""
  return " ".join(text.split())


def truncate(text, width, suffix="..."):
  """`text` cut to at most `width` characters, ending in `suffix` when cut."""
  if len(text) <= width:
    return text
  if width <= len(suffix):
    return suffix[:width]
  return text[:width - len(suffix)] + suffix


def pad_left(text, width, fill=" "):
  """`text` right-aligned in `width` characters."""
  missing = width - len(text)
  if missing <= 0:
    return text
  return fill * missing + text
''',
    "textkit/wrap.py": '''"""Line wrapping."""
from textkit.words import split_words


def wrap(text, width=20):
  """Greedy wrap of the words into lines of at most `width` characters."""
  lines, current = [], ""
  for word in split_words(text, lower=False):
    if not current:
      current = word
    elif len(current) + 1 + len(word) <= width:
      current = current + " " + word
    else:
      lines.append(current)
      current = word
  if current:
    lines.append(current)
  return lines


def initials(name):
  """Upper-case initials of a name."""
  return "".join(w[0].upper() for w in split_words(name, lower=False))
''',
    "tests/test_textkit.py": '''from textkit.clean import normalize_space, pad_left, truncate
from textkit.words import split_words, top_words, word_counts
from textkit.wrap import initials, wrap


def test_split_and_count():
  assert split_words("Hello,  world!") == ["hello", "world"]
  assert word_counts("a b a") == {"a": 2, "b": 1}
  assert top_words("b a b c a b") == ["b", "a"]


def test_clean():
  assert normalize_space("  a \\n b ") == "a b"
  assert truncate("abcdefgh", 6) == "abc..."
  assert pad_left("7", 3, "0") == "007"


def test_wrap():
  assert wrap("the quick brown fox", width=9) == ["the quick", "brown fox"]
  assert initials("ada lovelace") == "AL"
''',
}

TEXTKIT_HIDDEN = '''from textkit.clean import normalize_space, pad_left, truncate
from textkit.words import split_words, top_words, word_counts
from textkit.wrap import initials, wrap


def test_split_words_keeps_case_on_request():
  assert split_words("Hi There", lower=False) == ["Hi", "There"]


def test_split_words_drops_punctuation_only():
  assert split_words("a , b") == ["a", "b"]


def test_word_counts_mixed_case():
  assert word_counts("The the THE cat") == {"the": 3, "cat": 1}


def test_top_words_ties_and_n():
  assert top_words("x y z y x", n=3) == ["x", "y", "z"]
  assert top_words("one two two") == ["two", "one"]


def test_normalize_space_tabs():
  assert normalize_space("\\ta\\t\\tb") == "a b"


def test_truncate_short_and_exact():
  assert truncate("abc", 3) == "abc"
  assert truncate("abcdef", 5) == "ab..."


def test_truncate_tiny_width():
  assert truncate("abcdef", 2) == ".."


def test_pad_left_default_and_long():
  assert pad_left("ab", 4) == "  ab"
  assert pad_left("abcdef", 3) == "abcdef"


def test_wrap_exact_width():
  assert wrap("aa bb cc", width=5) == ["aa bb", "cc"]
  assert wrap("") == []


def test_wrap_default_width():
  assert wrap("one two three four five six") == ["one two three four", "five six"]


def test_initials_three_words():
  assert initials("grace brewster hopper") == "GBH"
'''

INVENTORY = {
    "inventory/__init__.py": '"""A small shop inventory."""\n',
    "inventory/items.py": '''"""Items and stock."""


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
''',
    "inventory/pricing.py": '''"""Prices and discounts."""


def line_price(unit_price, quantity):
  """Price of `quantity` units."""
  return unit_price * quantity


def apply_discount(amount, percent=10):
  """`amount` less `percent` percent, rounded to cents."""
  if percent < 0 or percent > 100:
    raise ValueError("percent must be in [0, 100]")
  return round(amount * (100 - percent) / 100, 2)


def bulk_discount_percent(quantity):
  """5 % from 10 units, 10 % from 50."""
  if quantity >= 50:
    return 10
  if quantity >= 10:
    return 5
  return 0
''',
    "inventory/orders.py": '''"""Orders against a price list."""
from inventory.pricing import apply_discount, bulk_discount_percent, line_price


def order_total(prices, order):
  """Sum over (name, quantity) lines with each line's bulk discount."""
  total = 0.0
  for name, quantity in order:
    amount = line_price(prices[name], quantity)
    total += apply_discount(amount, bulk_discount_percent(quantity))
  return round(total, 2)


def fill_order(stock, order):
  """Removes the order from stock; nothing is removed if any line cannot be filled."""
  for name, quantity in order:
    if stock.counts.get(name, 0) < quantity:
      return False
  for name, quantity in order:
    stock.remove(name, quantity)
  return True
''',
    "tests/test_inventory.py": '''from inventory.items import Stock
from inventory.orders import fill_order, order_total
from inventory.pricing import apply_discount, bulk_discount_percent


def test_stock():
  s = Stock()
  s.add("pen", 3)
  s.remove("pen", 2)
  assert s.counts == {"pen": 1} and s.total() == 1


def test_pricing():
  assert apply_discount(200.0) == 180.0
  assert bulk_discount_percent(10) == 5


def test_orders():
  prices = {"pen": 2.0, "pad": 5.0}
  assert order_total(prices, [("pen", 10), ("pad", 1)]) == 24.0
  s = Stock()
  s.add("pen", 5)
  assert fill_order(s, [("pen", 2)]) and s.counts == {"pen": 3}
''',
}

INVENTORY_HIDDEN = '''import pytest

from inventory.items import Stock
from inventory.orders import fill_order, order_total
from inventory.pricing import apply_discount, bulk_discount_percent, line_price


def test_add_default_quantity():
  s = Stock()
  s.add("cup")
  assert s.counts == {"cup": 1}


def test_add_rejects_zero():
  with pytest.raises(ValueError):
    Stock().add("cup", 0)


def test_remove_all_deletes():
  s = Stock()
  s.add("cup", 2)
  s.remove("cup", 2)
  assert s.counts == {} and s.total() == 0


def test_remove_too_many():
  s = Stock()
  s.add("cup", 1)
  with pytest.raises(ValueError):
    s.remove("cup", 2)


def test_line_price():
  assert line_price(2.5, 4) == 10.0


def test_discount_bounds():
  assert apply_discount(80.0, 0) == 80.0
  assert apply_discount(80.0, 100) == 0.0
  with pytest.raises(ValueError):
    apply_discount(1.0, 101)


def test_bulk_thresholds():
  assert bulk_discount_percent(9) == 0
  assert bulk_discount_percent(49) == 5
  assert bulk_discount_percent(50) == 10


def test_order_total_bulk():
  assert order_total({"a": 1.0}, [("a", 50)]) == 45.0
  assert order_total({"a": 3.0, "b": 1.0}, [("a", 1), ("b", 2)]) == 5.0


def test_fill_order_all_or_nothing():
  s = Stock()
  s.add("a", 1)
  s.add("b", 5)
  assert not fill_order(s, [("b", 2), ("a", 2)])
  assert s.counts == {"a": 1, "b": 5}
  assert fill_order(s, [("a", 1)]) and s.counts == {"b": 5}
'''

GEOMETRY = {
    "geometry/__init__.py": '"""Plane geometry."""\n',
    "geometry/points.py": '''"""Points and distances."""
import math


def distance(p, q):
  """Euclidean distance between points p and q."""
  return math.hypot(q[0] - p[0], q[1] - p[1])


def midpoint(p, q):
  return ((p[0] + q[0]) / 2, (p[1] + q[1]) / 2)


def manhattan(p, q):
  return abs(q[0] - p[0]) + abs(q[1] - p[1])
''',
    "geometry/shapes.py": '''"""Polygons."""
from geometry.points import distance


def perimeter(points, closed=True):
  """Length of the path through the points (back to the first when closed)."""
  total = 0.0
  for i in range(len(points) - 1):
    total += distance(points[i], points[i + 1])
  if closed and len(points) > 2:
    total += distance(points[-1], points[0])
  return total


def area(points):
  """Polygon area by the shoelace formula (0 for fewer than 3 points)."""
  if len(points) < 3:
    return 0.0
  s = 0.0
  for i in range(len(points)):
    x1, y1 = points[i]
    x2, y2 = points[(i + 1) % len(points)]
    s += x1 * y2 - x2 * y1
  return abs(s) / 2


def bounding_box(points):
  """(min x, min y, max x, max y)."""
  xs = [p[0] for p in points]
  ys = [p[1] for p in points]
  return (min(xs), min(ys), max(xs), max(ys))
''',
    "geometry/transform.py": '''"""Moves."""
from geometry.points import midpoint


def translate(points, dx, dy=0.0):
  return [(x + dx, y + dy) for x, y in points]


def scale_about(points, center, factor):
  """Points scaled by `factor` about `center`."""
  cx, cy = center
  return [(cx + (x - cx) * factor, cy + (y - cy) * factor) for x, y in points]


def centre_of_segment(segment):
  return midpoint(segment[0], segment[1])
''',
    "tests/test_geometry.py": '''from geometry.points import distance, manhattan, midpoint
from geometry.shapes import area, bounding_box, perimeter
from geometry.transform import centre_of_segment, scale_about, translate


def test_points():
  assert distance((0, 0), (3, 4)) == 5
  assert midpoint((0, 0), (2, 4)) == (1, 2)
  assert manhattan((1, 1), (4, -1)) == 5


def test_shapes():
  square = [(0, 0), (2, 0), (2, 2), (0, 2)]
  assert perimeter(square) == 8
  assert area(square) == 4
  assert bounding_box([(1, 5), (-2, 3)]) == (-2, 3, 1, 5)


def test_transform():
  assert translate([(1, 1)], 2) == [(3, 1.0)]
  assert scale_about([(2, 2)], (1, 1), 3) == [(4, 4)]
  assert centre_of_segment(((0, 0), (4, 0))) == (2, 0)
''',
}

GEOMETRY_HIDDEN = '''from geometry.points import distance, manhattan, midpoint
from geometry.shapes import area, bounding_box, perimeter
from geometry.transform import centre_of_segment, scale_about, translate


def test_distance_negative():
  assert distance((-1, -1), (2, 3)) == 5


def test_midpoint_fractional():
  assert midpoint((1, 1), (2, 2)) == (1.5, 1.5)


def test_manhattan_symmetric():
  assert manhattan((0, 0), (-3, 2)) == manhattan((-3, 2), (0, 0)) == 5


def test_perimeter_open_and_closed():
  path = [(0, 0), (3, 0), (3, 4)]
  assert perimeter(path, closed=False) == 7
  assert perimeter(path) == 12


def test_perimeter_two_points():
  assert perimeter([(0, 0), (0, 5)]) == 5


def test_area_triangle_and_degenerate():
  assert area([(0, 0), (4, 0), (0, 3)]) == 6
  assert area([(0, 0), (1, 1)]) == 0.0


def test_area_clockwise():
  assert area([(0, 0), (0, 2), (3, 2), (3, 0)]) == 6


def test_bounding_box_single():
  assert bounding_box([(2, 3)]) == (2, 3, 2, 3)


def test_translate_both_axes():
  assert translate([(0, 0), (1, 2)], 1, -1) == [(1, -1), (2, 1)]


def test_scale_about_origin_and_shrink():
  assert scale_about([(2, 4)], (0, 0), 0.5) == [(1, 2)]
  assert scale_about([(3, 3)], (1, 1), 2) == [(5, 5)]


def test_centre_of_vertical_segment():
  assert centre_of_segment(((1, 0), (1, 6))) == (1, 3)
'''

REPOS = {"statlib": (STATLIB, STATLIB_HIDDEN), "textkit": (TEXTKIT, TEXTKIT_HIDDEN),
         "inventory": (INVENTORY, INVENTORY_HIDDEN), "geometry": (GEOMETRY, GEOMETRY_HIDDEN)}
