"""The pipelined loop's logging stalls, simulated on a CPU (not a test): the real offline policy and graph on
vector_add, a fake evaluator (1 s plans on 8 planners, 0.5 s on each of 2 fake devices, timings made up from the
source's hash) and the PTX-twin compile slowed by 5 s, as a fresh process on a busy GPU machine is.

    python tests/experiments/stall_sim.py        # the policy as it is: PTX moves passed over while their compile runs
    python tests/experiments/stall_sim.py block  # every proposal waits for the compile (the loop before c2fc675)

Prints attempts per minute and the gaps over 3 s between two logged attempts (the H100 pair showed 26 of them).
"""
import dataclasses
import hashlib
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import evaluated  # noqa: E402  (tests/evaluated.py: results as the evaluator makes them)
from agent.graph import Loop, LoopSettings, run_loop  # noqa: E402
from agent.kernels import ptx_edits  # noqa: E402
from agent.policies import make_policy  # noqa: E402
from sandbox.pipeline import Pipeline  # noqa: E402
from test_pipeline import FakeSession  # noqa: E402
from tools.result import EvalResult  # noqa: E402
from tools.records.store import open_db  # noqa: E402
from tools.target import load_target  # noqa: E402

COMPILE_DELAY_S = 5.0
real_compile = ptx_edits.compile_for_target


def slow_compile(source, spec):
    time.sleep(COMPILE_DELAY_S)
    return real_compile(source, spec)


class FakeEvaluation:
    def __init__(self, source):
        self.source, self.planner, self.device = source, None, None
        self.result = EvalResult(language="triton")

    def plan(self):
        time.sleep(1.0)

    def bind(self, device):
        self.device = device

    def load(self):
        time.sleep(0.1)

    def verify(self):
        time.sleep(0.1)

    def profile(self):
        time.sleep(0.3)
        language = "ptx" if "PTX_TEXTS" in self.source else "triton"
        us = 100 + int(hashlib.sha256(self.source.encode()).hexdigest()[:4], 16) % 50
        self.result = evaluated.result("correct", us, eager_us=150.0, gpu=evaluated.H100, nbytes=int(50 * 3352e3),
                                       language=language,
                                       ptx={"vector_add_kernel": "// ptx"} if language == "triton" else {})

    def release_device(self):
        pass

    def versus_standing_best(self, device):
        pass

    def adopt_as_best(self, number):
        pass

    def close(self):
        return self.result


def main() -> None:
    ptx_edits.compile_for_target = slow_compile
    policy = make_policy("offline", target=load_target("vector_add"))
    if sys.argv[1:] == ["block"]:   # nothing in flight, as far as the policy knows: it waits for every compile
        propose = policy.propose
        policy.propose = lambda ctx: propose(dataclasses.replace(ctx, in_flight=0))
    tmp = Path(tempfile.mkdtemp(prefix="kloop-stall-sim-"))
    store = policy.store = open_db(tmp / "sim.db")
    run_id = store.create_run(target_name="vector_add", policy="offline")
    pipeline = Pipeline(FakeSession(planners=8, devices=2))
    loop = Loop(store=store, run_id=run_id, policy=policy, evaluation=lambda s: pipeline.submit(FakeEvaluation(s)),
                settings=LoopSettings(pipeline=10, max_attempts=60, language="auto"), target_name="vector_add",
                target_source="")
    began = time.monotonic()
    run_loop(loop, tmp / "sim.checkpoints")
    wall = time.monotonic() - began
    pipeline.close()
    walls = [a.durations["wall"] for a in store.attempts(run_id)]
    stalls = [w for w in walls[1:] if w > 3]
    print(f"{sys.argv[1] if sys.argv[1:] else 'as it is'}: {len(walls)} attempts in {wall:.1f} s = "
          f"{len(walls) / wall * 60:.0f}/min; {len(stalls)} gaps over 3 s between two logged attempts "
          f"({sum(stalls):.0f} s)")


if __name__ == "__main__":
    main()
