"""Tenants: who is calling, what they may use, and how much of it."""
