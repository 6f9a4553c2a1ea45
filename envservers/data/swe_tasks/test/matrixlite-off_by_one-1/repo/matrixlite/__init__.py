"""Lists-of-lists matrices."""
