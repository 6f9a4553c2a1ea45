"""Unit conversions."""
