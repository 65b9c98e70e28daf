"""Every public name of the package carries a docstring, so that a documentation generator
(pydoc, Sphinx autodoc, pdoc) renders the whole API."""

import inspect

import pytest
from _optional import import_torch

import stoker


def public(module_names):
    for name in module_names:
        obj = getattr(stoker, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue  # data, e.g. LIBRARY_PATH
        yield name, obj
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for attr, value in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if inspect.isfunction(value) or isinstance(value, property):
                    yield f"{name}.{attr}", value


@pytest.mark.parametrize("name,obj", [pytest.param(n, o, id=n) for n, o in public(stoker.__all__)])
def test_public_api_is_documented(name, obj):
    assert inspect.getdoc(obj), f"stoker.{name} has no docstring"


def test_torch_adapter_is_documented():
    import_torch()
    from stoker.torch import DataLoader

    assert inspect.getdoc(DataLoader)
    for attr, value in vars(DataLoader).items():
        if not attr.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)):
            assert inspect.getdoc(value), f"stoker.torch.DataLoader.{attr} has no docstring"
