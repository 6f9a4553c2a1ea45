"""Small statistics helpers."""
