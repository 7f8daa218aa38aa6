"""targetpo: Target Policy Optimization and its baselines."""

__version__ = "0.2.0.dev0"  # CHANGELOG.md: 0.2.0 (unreleased); pyproject.toml reads it from here
