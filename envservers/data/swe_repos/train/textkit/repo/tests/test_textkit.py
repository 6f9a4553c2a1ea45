from textkit.clean import normalize_space, pad_left, truncate
from textkit.words import split_words, top_words, word_counts
from textkit.wrap import initials, wrap


def test_split_and_count():
  assert split_words("Hello,  world!") == ["hello", "world"]
  assert word_counts("a b a") == {"a": 2, "b": 1}
  assert top_words("b a b c a b") == ["b", "a"]


def test_clean():
  assert normalize_space("  a \n b ") == "a b"
  assert truncate("abcdefgh", 6) == "abc..."
  assert pad_left("7", 3, "0") == "007"


def test_wrap():
  assert wrap("the quick brown fox", width=9) == ["the quick", "brown fox"]
  assert initials("ada lovelace") == "AL"
