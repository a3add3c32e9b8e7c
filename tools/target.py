"""Load a target: a KernelBench-style module (`Model`, `get_inputs()`, `get_init_inputs()`), built-in or by path.

Built-in targets may carry kloop extras as module globals: `KLOOP_SMALL` (overrides for a CPU-sized problem),
`KLOOP_VARIANTS` (hidden extra shapes, checked but never shown to the agent), `KLOOP_DESCRIPTION`.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType


class TargetError(Exception):
    """The target cannot be used; the message is one line for the user."""


@dataclass
class Target:
    name: str
    path: Path
    source: str
    module: ModuleType
    builtin: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    @property
    def description(self) -> str:
        return getattr(self.module, "KLOOP_DESCRIPTION", "")

    def shapes(self, small: bool) -> list[dict]:
        """Global overrides per checked shape: the main shape first, then the hidden variants."""
        base = dict(getattr(self.module, "KLOOP_SMALL", {})) if small else {}
        variants = [] if small else list(getattr(self.module, "KLOOP_VARIANTS", []))
        if small:  # hidden variants at CPU size: the small overrides, then each variant's sizes shrunk to fit
            variants = [dict(base, **v) for v in getattr(self.module, "KLOOP_SMALL_VARIANTS", [])]
        return [base] + variants

    @contextlib.contextmanager
    def overrides(self, values: dict):
        """Temporarily set module globals (sizes, dtype) so get_inputs/Model see another shape."""
        saved = {k: getattr(self.module, k) for k in values if hasattr(self.module, k)}
        missing = [k for k in values if k not in saved]
        if missing:
            raise TargetError(f"target {self.name} has no global(s) {', '.join(missing)} to override")
        for k, v in values.items():
            setattr(self.module, k, v)
        try:
            yield self
        finally:
            for k, v in saved.items():
                setattr(self.module, k, v)


def builtin_names() -> list[str]:
    from tools.targets import BUILTIN_TARGETS
    return list(BUILTIN_TARGETS)


def import_module_from_path(path: Path, prefix: str) -> ModuleType:
    """Import a file as a fresh, uniquely named module (two targets may share a file name)."""
    name = f"{prefix}_{path.stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_target(spec: str) -> Target:
    """A built-in name (`vector_add`) or a path to a KernelBench-style module."""
    from tools.targets import BUILTIN_TARGETS, path_of

    builtin = spec in BUILTIN_TARGETS
    path = path_of(spec) if builtin else Path(spec)
    if not builtin and not path.is_file():
        known = ", ".join(BUILTIN_TARGETS)
        raise TargetError(f"unknown target {spec!r}: not a built-in ({known}) and no such file")
    source = path.read_text()
    try:
        module = import_module_from_path(path, "kloop_target")
    except Exception as e:
        raise TargetError(f"target {spec} failed to import: {type(e).__name__}: {e}") from None
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not callable(getattr(module, attr, None)):
            raise TargetError(f"target {spec} has no {attr}: a target defines Model, get_inputs() and get_init_inputs()")
    return Target(name=spec if builtin else path.stem, path=path.resolve(), source=source, module=module, builtin=builtin)
