"""Attention backends: one per device kind, planned once per forward and called by every layer."""
