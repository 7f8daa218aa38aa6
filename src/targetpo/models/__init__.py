"""Small policy networks for the paper's experiments."""
