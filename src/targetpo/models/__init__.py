"""Policy networks used by the experiments."""
