"""targetpo: Target Policy Optimization and its baselines."""

__version__ = "0.1.0"
