"""Decontamination on the op a problem computes: a KernelBench-style problem edited between releases still matches."""
from __future__ import annotations

import pytest

from tools.records.decontaminate import load_problems, match, normalized_tokens, problem
from tools.targets import path_of

SOFTMAX_V1 = '''import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Simple model that performs a Softmax activation.
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)

batch_size = 16
dim = 16384

def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]

def get_init_inputs():
    return []  # No special initialization inputs needed
'''

# a later release: sizes renamed and changed, rand instead of randn, other comments and docstring, dim=-1
SOFTMAX_V2 = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """Softmax over the last dimension."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # one row at a time
        return torch.softmax(x, dim=-1)


batch = 4096
features = 393216


def get_inputs():
    return [torch.rand(batch, features)]


def get_init_inputs():
    return []
'''

GEMM_V1 = '''import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        x = self.gemm(x)
        return torch.relu(x * self.scale)

batch_size = 128
in_features = 1024
out_features = 512
scale = 2.0

def get_inputs():
    return [torch.randn(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features, scale]
'''
GEMM_V2 = GEMM_V1.replace("batch_size = 128", "batch_size = 1024  # bigger for H100").replace(
    "in_features = 1024", "in_features = 8192").replace("scale = 2.0", "scale = 0.5")
SIGMOID = SOFTMAX_V1.replace("torch.softmax(x, dim=1)", "torch.sigmoid(x)").replace("Softmax", "Sigmoid")


def test_two_releases_of_a_problem_match_on_the_op():
    for old, new, ops in ((SOFTMAX_V1, SOFTMAX_V2, ("_softmax",)), (GEMM_V1, GEMM_V2, ("t", "addmm", "mul", "relu"))):
        found = match(problem(new, "new"), [problem(old, "old")])
        assert found and found[0].name == "old" and found[1].startswith("the same op graph"), found
        assert problem(new, "new").ops == ops and ops[0] in found[1]
    # constants changed, comments added: the normalized sources are the same too (what counts where a trace fails)
    assert problem(GEMM_V1, "a").source_key == problem(GEMM_V2, "b").source_key


def test_a_different_op_does_not_match_however_alike_the_source():
    sigmoid, softmax = problem(SIGMOID, "sigmoid"), problem(SOFTMAX_V1, "softmax")
    assert match(sigmoid, [softmax, problem(GEMM_V1, "gemm")]) is None
    from tools.records.decontaminate import jaccard
    assert jaccard(sigmoid.shingles, softmax.shingles) > 0.8    # one token apart: the op decides, not the text


def test_an_untraceable_problem_falls_back_to_a_near_duplicate_source():
    # .item() reads data: no graph on the meta device
    untraced = SOFTMAX_V1.replace("return torch.softmax(x, dim=1)", "return torch.softmax(x, dim=int(x.sum().item()))")
    edited = untraced.replace("dim = 16384", "dim = 4096").replace("# No special", "# nothing")
    a, b = problem(untraced, "a"), problem(edited, "b")
    assert a.op is None and a.trace_error.startswith("RuntimeError")
    found = match(a, [b])
    assert found and found[1].startswith("the same source (comments, docstrings, layout and constants aside; op graph "
                                         "unknown, a: RuntimeError")
    renamed = edited.replace("x = torch.randn(batch_size, dim)", "x = torch.randn(batch_size, dim).abs()")
    found = match(problem(renamed, "c"), [a])
    assert found and found[1].startswith("a near-duplicate source (similarity 0.")


def test_a_problem_of_the_same_name_matches_though_its_math_changed():
    l1_2024 = SOFTMAX_V1.replace("torch.softmax(x, dim=1)", "x / torch.sum(torch.abs(x), dim=1, keepdim=True)")
    l1_2025 = l1_2024.replace("torch.sum", "torch.mean")      # KernelBench fixed the reference
    assert problem(l1_2024, "a").op != problem(l1_2025, "b").op
    found = match(problem(l1_2025, "38_L1Norm_"), [problem(SOFTMAX_V1, "level1/23_Softmax.py"),
                                                  problem(l1_2024, "level1/38_L1Norm_.py")])
    assert found[0].name == "level1/38_L1Norm_.py" and found[1] == "the same problem name"
    assert match(problem(SOFTMAX_V2, "23_Softmax"), [problem(SOFTMAX_V1, "level1/23_Softmax.py")])[1] == \
        "the same problem name and op graph"


def test_builtin_softmax_and_kernelbench_softmax_are_one_op():
    builtin = problem(path_of("softmax").read_text(), "softmax")
    assert builtin.group == problem(SOFTMAX_V1, "23_Softmax").group


def test_a_file_that_is_no_problem_is_never_run(tmp_path):
    script = f"open({str(tmp_path / 'ran')!r}, 'w')\n"      # a script found in an --exclude folder
    assert problem(script, "setup.py").trace_error.startswith("not a KernelBench-style module")
    assert not (tmp_path / "ran").exists()


def test_normalized_tokens_rename_constants_and_drop_docstrings():
    tokens = normalized_tokens('"""doc"""\nN = 16  # size\ndef f():\n    """inner"""\n    return N * 2\n')
    assert tokens == ["C", "=", "0", "def", "f", "(", ")", ":", "return", "C", "*", "0"]


def test_load_problems_names_files_and_refuses_a_missing_path(tmp_path):
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "23_Softmax.py").write_text(SOFTMAX_V1)
    assert [p.name for p in load_problems([tmp_path])] == ["level1/23_Softmax.py"]
    from tools.records.decontaminate import DecontaminationError
    with pytest.raises(DecontaminationError, match="no such file or folder"):
        load_problems([tmp_path / "missing"])
