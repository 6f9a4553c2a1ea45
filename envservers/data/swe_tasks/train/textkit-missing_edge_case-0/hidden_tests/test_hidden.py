from textkit.clean import normalize_space, pad_left, truncate
from textkit.words import split_words, top_words, word_counts
from textkit.wrap import initials, wrap


def test_word_counts_mixed_case():
  assert word_counts("The the THE cat") == {"the": 3, "cat": 1}
