from textkit.clean import normalize_space, pad_left, truncate
from textkit.words import split_words, top_words, word_counts
from textkit.wrap import initials, wrap


def test_wrap_exact_width():
  assert wrap("aa bb cc", width=5) == ["aa bb", "cc"]
  assert wrap("") == []
