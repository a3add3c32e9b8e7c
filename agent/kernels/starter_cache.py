"""Inductor starters kept on disk across suites and run databases: one JSON file per problem source, device
(GPU architecture, e.g. "sm_90", or "cpu-small"), torch and Triton versions and generator code
(agent/kernels/inductor.py's output, its defaults already tuned where a GPU timed them).

A generation takes 104-166 s on an H100 (Inductor's template benchmarks, the defaults timed), so a second suite over
the same problems, in any database, reads them here instead. Writes are atomic (a file of its own, then
`os.replace`), so writers side by side (lanes, suites on one node) never leave a half-written entry, and the last
one wins with the same content; an entry that does not parse or names another key is ignored (and rewritten by the
next generation).

    >>> cache = StarterCache.default()                       # $KLOOP_STARTER_CACHE, else ~/.cache/kloop/starters
    >>> key = starter_key(sha256, "sm_90", "2.11.0", "3.6.0", generator)
    >>> cache.get(key) or cache.put(key, {"starter": generated.to_dict(), "error": None, "seconds": 41.0})
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

ENV = "KLOOP_STARTER_CACHE"
FORMAT = 1


def default_folder() -> Path:
    """$KLOOP_STARTER_CACHE, else starters/ under $XDG_CACHE_HOME/kloop (~/.cache/kloop)."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kloop" / "starters"


def starter_key(target_sha256: str, device: str, torch_version: str, triton_version: str, generator: str) -> dict:
    """What a starter depends on: the problem's source (module, init inputs and inputs are all in it), the device it
    was generated and timed for, the versions that generated it, and kloop's generator code."""
    return {"target_sha256": target_sha256, "device": device, "torch": torch_version, "triton": triton_version,
            "generator": generator}


class StarterCache:
    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)

    @classmethod
    def default(cls) -> "StarterCache":
        return cls(default_folder())

    def path(self, key: dict) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
        return self.folder / digest[:2] / f"{digest}.json"

    def get(self, key: dict) -> dict | None:
        """{starter, error, seconds} kept for key; None where there is none, or it is unreadable or for another key."""
        try:
            entry = json.loads(self.path(key).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key:
            return None
        starter, error = entry.get("starter"), entry.get("error")
        if not (isinstance(starter, dict) and isinstance(starter.get("source"), str) and error is None
                or starter is None and isinstance(error, str)):
            return None
        return {"starter": starter, "error": error, "seconds": entry.get("seconds")}

    def put(self, key: dict, entry: dict) -> None:
        """Keep {starter, error, seconds} for key, atomically; a cache that cannot be written is left alone (the
        starter still reaches the run database)."""
        path = self.path(key)
        text = json.dumps({"format": FORMAT, "key": key, "starter": entry["starter"], "error": entry["error"],
                           "seconds": entry.get("seconds")})
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(prefix=f".{path.stem[:16]}-", suffix=".tmp", dir=path.parent)
            try:
                with os.fdopen(handle, "w") as f:
                    f.write(text)
                os.replace(temporary, path)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
        except OSError:
            return
