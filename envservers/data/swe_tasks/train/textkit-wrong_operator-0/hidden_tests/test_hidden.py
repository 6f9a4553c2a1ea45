from textkit.clean import normalize_space, pad_left, truncate
from textkit.words import split_words, top_words, word_counts
from textkit.wrap import initials, wrap


def test_pad_left_default_and_long():
  assert pad_left("ab", 4) == "  ab"
  assert pad_left("abcdef", 3) == "abcdef"
