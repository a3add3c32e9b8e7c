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
