"""Environments and tasks: tabular bandits, MNIST, token sequences."""

import importlib.util


class MissingDataError(FileNotFoundError):
    """A task's external data set could not be found; the message says how to provide it."""


class MissingExtraError(MissingDataError):
    """An optional extra an experiment needs is not installed. Like missing data, it means the experiment cannot
    run here: `targetpo run` refuses with one line, `targetpo reproduce` reports the experiment NOT RUN."""


# The optional extras of pyproject.toml and the modules each brings, declared once: the CLI names the extra of a
# module it cannot import, and an experiment with ``REQUIRES_EXTRA`` is checked against it before anything runs.
EXTRA_MODULES = {"llm": ("transformers", "tokenizers", "accelerate", "peft", "reasoning_gym", "math_verify"),
                 "trl": ("trl",), "verl": ("verl",)}


EXTRA_OF_MODULE = {module: extra for extra, modules in EXTRA_MODULES.items() for module in modules}


def extra_of(exc: BaseException) -> tuple[str, str | None]:
    """(the top-level module a ModuleNotFoundError could not import, the extra that brings it or None)."""
    module = (getattr(exc, "name", None) or "").split(".")[0]
    return module, EXTRA_OF_MODULE.get(module)


def needs_extra(who: str, extra: str, module: str) -> str:
    """The one-line message for `who` missing `extra` (its `module` not installed), with how to install it."""
    return (f"{who} needs the {extra} extra (no module named {module!r}): pip install 'targetpo[{extra}]' (in a "
            f"checkout: pip install -e '.[{extra}]')")


def require_extra(extra: str, who: str) -> None:
    """MissingExtraError naming `who`, the extra and its first module that is not installed (nothing is imported)."""
    for module in EXTRA_MODULES[extra]:
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(needs_extra(who, extra, module))
