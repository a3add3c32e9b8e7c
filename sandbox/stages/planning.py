"""The plan phase (any thread; it needs no device): the rules, then a jailed planner records a launch plan per shape,
copied and checked here; the SASS of its kernels, disassembled beside the device phase.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from sandbox.plan import PlanError, copy_plan, load_plan
from sandbox.process import read_limited
from sandbox.stages.base import Stage
from tools import rules
from tools.result import EvalResult

# Calls of forward recorded at the main shape after the compiling one: they must all launch the same plan, so a
# forward that changes its work after a number of calls is refused rather than judged on its early calls.
RECORDED_CALLS = 20
# The record command's limit: the hang limit for every RECORDS_PER_HANG_LIMIT calls it records. Recording is the
# candidate's Python alone (no kernel runs), about 0.25 ms a launch on an H200's host: 20 calls of a 6-layer
# bidirectional LSTM (6144 launches each) took over 30 s, and KernelBench level 3's 38 timed out under one limit.
RECORDS_PER_HANG_LIMIT = 10
# A plan's module state (parameters, buffers, cached workspaces) may hold at most twice the reference's parameters and
# buffers plus this: the trusted side copies it, keeps it and restores it before every call, so a candidate must not
# make it hold gigabytes a target without weights never needed.
STATE_SLACK_BYTES = 64 << 20


def record_limit(hang_s: float, records: int) -> float:
    """The limit of a record command of `records` calls (RECORDS_PER_HANG_LIMIT)."""
    return hang_s * -(-records // RECORDS_PER_HANG_LIMIT)


class Planning(Stage):
    _sass: tuple[threading.Thread, dict[str, str]] | None   # disassembling while the device works

    def plan(self) -> EvalResult:
        with self._stage("plan"):
            self._plan()
        return self.result

    def _plan(self) -> None:
        began = time.perf_counter()
        try:
            broken = rules.check_source(self.source)
        except SyntaxError as e:
            return self._finish("compile_error", f"syntax error at line {e.lineno}: {e.msg}")
        if broken:
            return self._finish("rejected", *broken)
        self._waited("rules", began)
        began = time.perf_counter()
        self.planner = self.session.pool.acquire("planner", limits=self._jail_limits(planner=True))
        self._waited("planner:acquire", began)
        if self.abandoned:
            return self._close_planner()
        candidate = self.planner.workdir / "candidate.py"
        candidate.write_text(self.source)
        reply = self._call(self.planner, self.settings.load_timeout_s, "load", target_source=self.target.source,
                           candidate=str(candidate), init_seed=self.init_seed)
        if not self._ok(reply, hidden=None):
            return self._close_planner()
        self.plans_dir = Path(tempfile.mkdtemp(prefix=f"eval-{self.index}-", dir=self.session.directory))
        for i, shape in enumerate(self.shapes):
            if self.abandoned:
                return self._close_planner()
            if i == 1:  # what the candidate prints from here on may carry hidden shapes: keep only what came before
                self._output_cut = self.planner.output_sizes()
            perturb = {"perturb": self._seed("weights")} if i == self.weights_index else {}
            reply = self._call(self.planner, self.settings.load_timeout_s, "build", shape=i, overrides=shape,
                               seed=self._seed("plan", i), python_s=self._run_timeout(), **perturb)
            if perturb and reply.get("status") == "ok":
                self.matched = list(reply.get("matched") or [])
                self.shape_keys[i] = f"{self.shape_keys[0]}:weights:" + hashlib.sha256(
                    json.dumps([perturb["perturb"], self.matched]).encode()).hexdigest()[:16]
            if self._ok(reply, hidden=self._variant(i)):  # compiled: a hang costs the hang limit from here, not compile's
                records = RECORDED_CALLS if i == 0 else 3
                reply = self._call(self.planner, record_limit(self._run_timeout(), records), "record",
                                   out=str(self.planner.workdir / f"plan-{i}"), records=records)
            if not self._ok(reply, hidden=self._variant(i)):
                return self._close_planner()
            began = time.perf_counter()
            try:
                copy_plan(self.planner.workdir / f"plan-{i}", self.plans_dir / str(i))
                self._check_state(i)
            except PlanError as e:
                self._close_planner()
                return self._finish("rejected", *self._hidden(self._variant(i), "rejected",
                                                              f"the launch plan: {e}"))
            if i == 0:
                self._start_sass()
            self._waited("plan:copy", began)
        began = time.perf_counter()
        self._close_planner()
        self._waited("planner:close", began)

    def _check_state(self, i: int) -> None:
        """Refuse (PlanError) a plan whose module state outgrows the reference's (STATE_SLACK_BYTES)."""
        held = sum(entry["nbytes"] for entry in load_plan(self.plans_dir / str(i) / "plan.json").state)
        reference = self.target.state_bytes(small=not self.session.cuda)
        if held > 2 * reference + STATE_SLACK_BYTES:
            raise PlanError(f"its module state (parameters, buffers, workspaces made before forward) holds {held} "
                            f"bytes, over twice the reference's {reference} plus {STATE_SLACK_BYTES >> 20} MiB: "
                            "allocate workspaces in forward instead")

    def _start_sass(self) -> None:
        """The SASS of the main plan's Triton kernels, disassembled (cuobjdump: trusted, CPU only) on a thread of its
        own while the hidden shapes build and the device phase goes on: it took a fifth of a candidate's overhead.
        `collect_sass` (or `close`) joins it."""
        from tools.assemble import sass_of

        if not self.session.cuda:
            return
        try:
            plan = load_plan(self.plans_dir / "0" / "plan.json")
        except PlanError:
            return  # the device phase reports it
        cubins = {k.name: (plan.directory / k.blob).read_bytes() for k in plan.kernels if k.kind == "triton" and k.blob}
        listings: dict[str, str] = {}

        def disassemble() -> None:
            for name, cubin in cubins.items():
                with contextlib.suppress(RuntimeError, OSError, subprocess.SubprocessError):  # the listing is extra
                    listings[name] = sass_of(cubin)

        self._sass = (threading.Thread(target=disassemble, name=f"sass-{self.index}", daemon=True), listings)
        self._sass[0].start()

    def collect_sass(self) -> None:
        """The SASS listings into the result (the disassembly thread joined); the result is complete after it."""
        if self._sass is None:
            return
        began = time.perf_counter()
        thread, listings = self._sass
        thread.join()
        self.result.sass.update({name: sass for name, sass in listings.items() if sass})
        self._sass = None
        self._ptx_sass()
        self._waited("sass", began)

    def _ptx_sass(self) -> None:
        """The SASS of the PTX kernels the executor ran: assembled again here (ptxas, trusted) for this GPU's
        architecture, known once the device phase has run."""
        from tools.assemble import PtxAssembleError, assemble_ptx, sass_of

        cc = (self.result.gpu or {}).get("cc")
        ptx_kernels = {r.kernel for r in self.result.resources if r.source == "ptxas" and r.kernel in self.result.ptx}
        for name in ptx_kernels if cc else ():
            with contextlib.suppress(PtxAssembleError, ValueError, RuntimeError, OSError, subprocess.SubprocessError):
                listing = sass_of(assemble_ptx(self.result.ptx[name], "sm_" + cc.replace(".", "")).cubin)
                if listing:
                    self.result.sass[name] = listing

    def _close_planner(self) -> None:
        if self.planner is None:
            return
        cut = getattr(self, "_output_cut", None)
        self.result.stdout = read_limited(self.planner.stdout_path, stop=cut[0] if cut else None)
        self.result.stderr = read_limited(self.planner.stderr_path, stop=cut[1] if cut else None)
        self.planner.close()
        self.planner = None
