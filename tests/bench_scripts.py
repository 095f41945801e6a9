"""Loading a script of bench/ as a module, for the tests of its functions (bench/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_script(name: str) -> ModuleType:
    """bench/<name>.py as the module `bench_<name>`. bench/ is on sys.path while it loads (scripts import
    bench/report.py as `report`), and the module is registered first, so its dataclasses resolve their
    annotations through it."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))
