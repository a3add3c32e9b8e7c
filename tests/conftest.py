import os

import pytest

# Triton must pick its interpreter before it is imported anywhere, so CPU runs work without a GPU.
try:
    import torch
    HAS_GPU = torch.cuda.is_available()
except Exception:  # torch missing is reported by the imports of the tests themselves
    HAS_GPU = False
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# tests/experiments/ holds scripts run by hand (mostly on a GPU; results/ keeps what they measured), not tests:
# collecting would import them, and one named test_*.py would run.
collect_ignore = ["experiments"]
