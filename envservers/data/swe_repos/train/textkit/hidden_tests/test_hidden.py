from textkit.clean import normalize_space, pad_left, truncate
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
  assert normalize_space("\ta\t\tb") == "a b"


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
