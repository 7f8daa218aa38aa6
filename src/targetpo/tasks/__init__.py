"""Environments and tasks: tabular bandits, MNIST, token sequences."""
