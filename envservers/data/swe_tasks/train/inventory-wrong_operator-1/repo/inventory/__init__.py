"""A small shop inventory."""
