"""Word frequencies."""

import collections
import re


def top_words(text, n):
  """The n most frequent words (lower-cased, punctuation stripped), ties alphabetical."""
  words = re.findall(r"[a-z']+", text)
  counts = collections.Counter(words)
  return sorted(counts.items(), key=lambda item: (item[1], item[0]))[:n]


if __name__ == "__main__":
  print(top_words("the cat and the hat", 2))
