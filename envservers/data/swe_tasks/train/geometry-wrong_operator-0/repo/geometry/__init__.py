"""Plane geometry."""
