"""Seed-batched policy networks for the paper's experiments."""
