from textkit.clean import normalize_space, pad_left, truncate
from textkit.words import split_words, top_words, word_counts
from textkit.wrap import initials, wrap


def test_top_words_ties_and_n():
  assert top_words("x y z y x", n=3) == ["x", "y", "z"]
  assert top_words("one two two") == ["two", "one"]
