"""Accounts and transfers."""
