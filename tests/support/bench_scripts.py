"""Loading a ``bench/<name>.py`` script as a module (the scripts are not a package)."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from support.paths import REPO_ROOT


def load_bench_script(name: str) -> Any:
    """``bench/<name>.py`` as a module, registered under its name, as its dataclasses look their
    module up."""
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
