"""The load stage: the device's executor and referee take the plans (without a GPU, PTX is assembled, not run).
"""
from __future__ import annotations

import math
import shutil
import time

from sandbox.plan import ITEMSIZE, load_plan
from sandbox.stages.base import Stage
from tools.result import EvalResult, Resources

PTX_NOT_RUN = "no CUDA GPU: the PTX was assembled for sm_90 by ptxas but not run"


class Loading(Stage):
    def load(self) -> EvalResult:
        if self.result.verdict is not None or self.plans_dir is None:
            return self.result
        with self._stage("load"):
            self._load()
        return self.result

    def _load(self) -> None:
        if not self._locked:
            self.bind(self.device)
        device = self.device
        device.use_target(self.target)
        if self.session.cuda:
            self.executor = device.executor()
            self.result.gpu = device.gpu()
        else:
            began = time.perf_counter()
            self.executor = self.session.pool.acquire("executor", limits=self._jail_limits())
            self._waited("executor:acquire", began)
        self.keys = [f"e{self.index}:{i}" for i in range(len(self.shapes))]
        for i, (shape, key) in enumerate(zip(self.shapes, self.shape_keys)):
            self._referee_shape(i)
            reply = self._call(self.executor, 120, "shape", shape=key, target_source=self.target.source,
                               overrides=shape)
            if not self._ok(reply, hidden=self._variant(i)):
                return
            plan_dir = self.plans_dir / str(i)
            if not self.session.cuda:  # the jailed executor reads only its own directory
                shutil.copytree(plan_dir, self.executor.workdir / f"plan-{i}")
                plan_dir = self.executor.workdir / f"plan-{i}"
            reply = self._call(self.executor, self.settings.load_timeout_s, "load", key=self.keys[i],
                               plan_dir=str(plan_dir), shape=key)
            if reply.get("status") == "not_run":
                return self._ptx_not_run()
            if not self._ok(reply, hidden=self._variant(i)) or self._overran(reply, i):
                return
            plan = load_plan(self.plans_dir / str(i) / "plan.json")
            if i == 0:
                self._take_resources(reply.get("resources") or [], plan)
                self.result.flags += [f"autotuned: site {t['site']} ran option {t['chosen']} of {len(t['ms'])} "
                                      f"(medians {', '.join(f'{ms:.3f}' for ms in t['ms'])} ms)"
                                      for t in reply.get("tuned") or []]
                sites = len(plan.sites())
                if sites and not self.session.cuda:   # what this verdict could not check
                    self.result.flags.append(f"autotuned: the CPU ran the first configuration of every autotuned "
                                             f"launch ({sites} site{'s' * (sites > 1)}); a GPU runs the fastest, "
                                             "which only a GPU's checks judge")
                self.io_bytes = sum(x.nbytes for x in plan.inputs if x.dtype is not None) + \
                    sum(ITEMSIZE[o.dtype] * math.prod(o.shape) for o in plan.outputs)
            self.output_meta.append([{"dtype": o.dtype, "shape": o.shape} for o in plan.outputs])
        self.result.executed_on = "cuda" if self.session.cuda else "cpu-interpreter"

    def _ptx_not_run(self) -> None:
        """No GPU: assemble the plan's PTX here (ptxas, trusted) and report its resources; nothing ran."""
        from tools.assemble import PtxAssembleError, assemble_ptx, sass_of

        plan = load_plan(self.plans_dir / "0" / "plan.json")
        for k in plan.kernels:
            if k.kind != "ptx":
                continue
            try:
                assembly = assemble_ptx(k.ptx, "sm_90")
            except (PtxAssembleError, ValueError) as e:  # ValueError: text ptxas cannot take (hostile plan data)
                return self._finish("compile_error", str(e))
            usage = assembly.kernels.get(k.name)
            if usage:
                self.result.resources.append(Resources(kernel=k.name, source="ptxas", registers=usage["registers"],
                                                       spills=usage["spill_stores_bytes"] // 4,
                                                       shared_bytes=usage["shared_bytes"]))
            self.result.ptx[k.name] = k.ptx
            sass = sass_of(assembly.cubin)
            if sass:
                self.result.sass[k.name] = sass
            self.result.compile_log = assembly.log
        self.result.timing_note = PTX_NOT_RUN
        self._finish("runtime_error", "not run: no CUDA GPU here (PTX is assembled, not run, without a GPU)")

    def _take_resources(self, rows: list[dict], plan) -> None:
        """The executor's resource rows, one per plan kernel in order; each kernel's PTX from the plan itself (in the
        reply, a whole network's PTX outgrew its size limit: level 3's AlexNet, 1 MiB)."""
        for row, kernel in zip(rows, plan.kernels):
            if kernel.ptx:
                self.result.ptx[kernel.name] = kernel.ptx
            self.result.resources.append(Resources(**{k: v for k, v in row.items()
                                                      if k in Resources.__dataclass_fields__}))
