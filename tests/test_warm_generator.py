"""agent/kernels/warm_generator.py: starters generated one after another in one warm child are those a fresh child
(inductor.generate) makes; a failing target leaves the child alive; a killed child is a GenerationStopped, and the
next generation starts another."""
import threading
import time

import pytest

from agent.kernels import inductor
from agent.kernels.warm_generator import WarmGenerator

BROKEN = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x @ x\n" \
         "def get_inputs():\n    return [torch.randn(8, 3)]\ndef get_init_inputs():\n    return []\n"


@pytest.mark.slow
def test_a_warm_child_generates_as_a_fresh_one_one_target_after_another(tmp_path):
    (tmp_path / "broken.py").write_text(BROKEN)
    generator = WarmGenerator(small=True)
    try:
        first = generator.generate("vector_add")
        child = generator._child.pid
        with pytest.raises(inductor.NoStarter, match="the reference fails"):
            generator.generate(str(tmp_path / "broken.py"))
        second = generator.generate("softmax")
        assert generator._child.pid == child   # one child for all three
        assert first.to_dict() == inductor.generate("vector_add", small=True).to_dict()
        assert second.kernels and "class ModelNew(Model)" in second.source

        outcome = []
        thread = threading.Thread(target=lambda: outcome.append(_outcome(generator, "rmsnorm")))
        thread.start()
        time.sleep(0.5)
        generator.kill()
        thread.join(60)
        assert outcome and isinstance(outcome[0], inductor.GenerationStopped)
        assert generator.generate("vector_add").to_dict() == first.to_dict()   # in a new child
        assert generator._child.pid != child
    finally:
        generator.close()
    assert generator._child is None and not inductor._RUNNING


def _outcome(generator, spec):
    try:
        return generator.generate(spec)
    except inductor.NoStarter as e:
        return e


@pytest.mark.gpu
def test_a_warm_child_on_a_gpu_is_listed_as_its_user_and_generates_alike_twice():
    """A suite's warm child on a GPU is listed in the GPU's registry (a timing there stops it, sandbox/pool.py); its
    second generation of a target has the first's kernels and tunables (the defaults are timed: they may differ)."""
    import torch

    from agent import suite
    from sandbox import pool
    from tools.profile import gpu_uuid

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    assert suite.starter_device() == "sm_{}{}".format(*torch.cuda.get_device_capability())
    generator = WarmGenerator(visible="0", started=suite._gpu_user("0"))
    try:
        first = generator.generate("softmax")
        assert generator._child.pid in pool._listed(pool._directory(gpu_uuid("0")))
        second = generator.generate("softmax")
        assert (first.kernels, first.tunables) == (second.kernels, second.tunables)
    finally:
        generator.close()


FLAKY_CHILD = '''import json, sys
served = 0
for line in sys.stdin:
    target = json.loads(line)["target"]
    served += 1
    if target == "flaky" and served > 1 or target == "broken":
        reply = {"error": "torch.compile could not generate code for the reference: InductorError: AssertionError"}
    else:
        reply = {"source": f"# {target} by child {served}", "tunables": {}, "defaults": {}, "notes": ""}
    print("kloop-starter " + json.dumps(reply), flush=True)
'''


def test_inductors_own_failure_in_a_used_child_is_tried_again_in_a_fresh_one(tmp_path, monkeypatch):
    # A child that fails "flaky" only after it generated something else (Inductor's state outliving a generation),
    # and "broken" always: the first is generated in a fresh child, the second fails there too (tried twice).
    import subprocess
    import sys

    (tmp_path / "child.py").write_text(FLAKY_CHILD)
    starts = []

    def start(self):
        starts.append(1)
        self._stderr = open(tmp_path / "stderr", "wb")
        self._child = subprocess.Popen([sys.executable, str(tmp_path / "child.py")], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=self._stderr)
        self._buffer, self._served = b"", 0
        return self._child

    monkeypatch.setattr(WarmGenerator, "_start", start)
    generator = WarmGenerator(small=True)
    try:
        assert generator.generate("vector_add").source == "# vector_add by child 1"
        assert generator.generate("flaky").source == "# flaky by child 1"   # the fresh child's first
        assert len(starts) == 2
        with pytest.raises(inductor.NoStarter) as failed:
            generator.generate("broken")
        assert failed.value.kind == "compile_error" and len(starts) == 3   # the fresh child's failure stands
    finally:
        generator.close()
