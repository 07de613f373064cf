"""A pytest plugin (``-p constants``, .dev on PYTHONPATH): module constants set for the whole run, in every
xdist worker, from ``SET`` (``MODULE.CONSTANT=INT[,...]``, as ``tfd bench --variant`` names them), so the GPU
tests run the path a variant would before it becomes the default."""

from __future__ import annotations

import importlib
import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    for item in filter(None, os.environ.get("SET", "").split(",")):
        key, _, value = item.partition("=")
        module_name, _, constant = key.rpartition(".")
        module = importlib.import_module(module_name)
        setattr(module, constant, type(getattr(module, constant))(int(value)))
