"""Line wrapping."""
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
