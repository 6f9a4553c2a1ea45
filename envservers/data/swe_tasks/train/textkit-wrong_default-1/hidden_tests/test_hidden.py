from textkit.clean import normalize_space, pad_left, truncate
from textkit.words import split_words, top_words, word_counts
from textkit.wrap import initials, wrap


def test_truncate_short_and_exact():
  assert truncate("abc", 3) == "abc"
  assert truncate("abcdef", 5) == "ab..."
