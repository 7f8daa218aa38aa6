"""Environments and tasks: tabular bandits, MNIST, token sequences."""


class MissingDataError(FileNotFoundError):
    """A task's external data set could not be found; the message says how to provide it."""
