"""Package attributes that import their module on first use (PEP 562), so a torch-free corner of a package
(configs, run status, the queue) imports without torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_getattr(
    package: str, names: dict[str, str], namespace: dict[str, Any], submodules: tuple[str, ...] = ()
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``names`` maps an attribute to the module that defines it;
    ``submodules`` are subpackages imported on first use (``pickaxe.algos``).

    The value is cached in ``namespace`` (the package's ``globals()``), so each name is looked up once.
    """

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
        elif name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    return __getattr__
