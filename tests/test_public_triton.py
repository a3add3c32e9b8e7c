"""tests/experiments/public_triton.py builds its candidates from a library's modules as written: what an entry point
needs, across the package's modules, its platform `if`s resolved as the library resolves them, nothing else (not a
module's own test code, not helpers nobody calls). Checked on a package of kloop's making, without installing
anything; bad input is one line and exit status 2."""
import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

from tools.rules import check_source

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def public_triton():
    spec = importlib.util.spec_from_file_location("public_triton", REPO / "tests" / "experiments" / "public_triton.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclass looks its module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


UTILS = '''
import functools
import os

import triton

USE_LIBDEVICE = True


def ensure_contiguous(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*[a.contiguous() for a in args])

    return wrapper


def working_directory():
    return os.getcwd()
'''

OPS = '''
import torch
import triton
import triton.language as tl

from kloop_fakelib.utils import USE_LIBDEVICE, ensure_contiguous

if USE_LIBDEVICE:
    try:
        from triton.language.extra.libdevice import tanh
    except ModuleNotFoundError:
        from triton.language.extra.cuda.libdevice import tanh
else:
    from triton.language.math import tanh


@triton.jit
def _tanh_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tanh(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)


@ensure_contiguous
def tanh_forward(x):
    out = torch.empty_like(x)
    _tanh_kernel[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), BLOCK=128)
    return out


x = torch.ones(3)
print(tanh_forward(x))
'''


@pytest.fixture
def fakelib(tmp_path, monkeypatch):
    package = tmp_path / "kloop_fakelib"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "utils.py").write_text(UTILS)
    (package / "ops.py").write_text(OPS.replace("print(tanh_forward(x))", "print(x)"))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "kloop_fakelib"
    for name in [m for m in sys.modules if m.startswith("kloop_fakelib")]:
        del sys.modules[name]


def test_a_candidate_is_what_the_entry_point_needs_as_written(public_triton, fakelib):
    inliner = public_triton.Inliner(fakelib)
    inliner.need("kloop_fakelib.ops", "tanh_forward")
    text = inliner.text()
    # the library's own import replaced by what it imports, ahead of its use; decorators and comments kept
    assert text.index("def ensure_contiguous(fn):") < text.index("@ensure_contiguous\ndef tanh_forward(x):")
    assert "@triton.jit\ndef _tanh_kernel(" in text and "    @functools.wraps(fn)\n" in text
    assert "kloop_fakelib" not in text
    # the platform `if` resolved as the library resolves it here: the fallback chain, not the other branch
    assert "try:\n    from triton.language.extra.libdevice import tanh\nexcept ModuleNotFoundError:\n" in text
    assert "triton.language.math" not in text and "USE_LIBDEVICE" not in text
    # neither the module's own test code (x, a parameter's name) nor what nothing calls (os)
    assert "torch.ones(3)" not in text and "print(" not in text and "import os" not in text
    model = "\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return tanh_forward(x)\n"
    assert check_source(text + model) == []


def test_an_aliased_import_of_the_library_is_refused_in_one_line(public_triton, fakelib, tmp_path):
    (tmp_path / "kloop_fakelib" / "aliased.py").write_text(
        "from kloop_fakelib.utils import ensure_contiguous as ec\n\n\n@ec\ndef f(x):\n    return x\n")
    inliner = public_triton.Inliner(fakelib)
    with pytest.raises(SystemExit, match="cannot be inlined"):
        inliner.need("kloop_fakelib.aliased", "f")


@pytest.mark.parametrize("args, message", [
    (["--tutorials", "/nonexistent"], "holds no 01-vector-add.py"),
    (["--only", "liger/nope"], "no case liger/nope"),
])
def test_bad_input_is_one_line_and_exit_status_2(public_triton, capsys, args, message):
    assert public_triton.main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_every_case_has_a_reference_and_a_model(public_triton):
    for case in public_triton.CASES + public_triton.TUTORIAL_CASES:
        assert "class Model(nn.Module)" in case.reference and "def get_inputs" in case.reference, case.name
        assert "class ModelNew(torch.nn.Module)" in case.model and all(e in case.model for e in case.entries)
        compile(textwrap.dedent(case.reference), case.name, "exec")
