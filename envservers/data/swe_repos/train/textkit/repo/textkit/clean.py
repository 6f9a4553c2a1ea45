"""Cleaning."""


def normalize_space(text):
  """Runs of whitespace collapsed to one space, ends stripped."""
  return " ".join(text.split())


def truncate(text, width, suffix="..."):
  """`text` cut to at most `width` characters, ending in `suffix` when cut."""
  if len(text) <= width:
    return text
  if width <= len(suffix):
    return suffix[:width]
  return text[:width - len(suffix)] + suffix


def pad_left(text, width, fill=" "):
  """`text` right-aligned in `width` characters."""
  missing = width - len(text)
  if missing <= 0:
    return text
  return fill * missing + text
