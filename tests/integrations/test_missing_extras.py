"""Importing an integration without its extra names the extra to install (it raised the bare
ModuleNotFoundError of whichever transitive module came first: 'accelerate' for the TRL adapter)."""

import importlib
import sys

import pytest


@pytest.mark.parametrize("module, hidden, extra", [
    ("targetpo.integrations.trl", ("accelerate", "trl"), "trl"),
    ("targetpo.integrations.trl", ("trl",), "trl"),
    ("targetpo.integrations.verl_plugin", ("verl",), "verl"),
])
def test_an_integration_without_its_extra_names_it(module, hidden, extra, monkeypatch):
    for name in hidden:  # import fails as if not installed, also for submodules another test imported already
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.setitem(sys.modules, loaded, None)
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ModuleNotFoundError, match=rf"^{module} needs the {extra} extra \(no module named "
                                                  rf"'{hidden[0]}'\): pip install 'targetpo\[{extra}\]'") as info:
        importlib.import_module(module)
    assert info.value.name == hidden[0]
