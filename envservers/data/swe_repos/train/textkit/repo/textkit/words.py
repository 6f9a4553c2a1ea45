"""Words and counting."""
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
