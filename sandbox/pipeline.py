"""Candidates evaluated in the background: planned in parallel, timed one at a time per device.

    with Session(gpus=["0", "1"], planners=12, spares=12) as session:
        pending = [session.submit(target, source) for source in sources]   # all start planning at once
        for p in pending:                      # in submission order; each call waits for its stage
            with p:
                p.assemble(), p.verify(), p.profile()
                print(p.result.verdict, p.result.median_us)

Each submitted candidate goes through two queues:

1. Planning (`Session.planners` threads, each driving its own jailed planner: the candidate's Python and Triton's
   compile run on the CPU cores, many at once). A candidate that fails here (rules, compile, a refused plan) is
   finished without a device.
2. Devices (one thread per device: the GPU's trusted executor and referee, or the CPU's): the planned candidate with
   the lowest submission number goes to the first free device, which loads, verifies and profiles it and then lets
   go of it. One candidate at a time per device, and while it times, the session's jailed processes on that GPU are
   stopped (Device.quiet), so a timed kernel never shares its GPU with other work.

A re-judgement (`Submitted.rejudge`: the paired re-measurement against a best adopted after this candidate was
profiled) goes before any waiting candidate. A device that is lost on the way (a Ray actor whose node died:
`DeviceLost`) loses only the candidate it held, which goes back to the queue for the other devices. The trust model
is the evaluator's: nothing here decides a verdict. `Pipeline.interrupt` is Ctrl-C for a thread that waits on a
stage but is not the main thread (a suite's lane): every wait raises KeyboardInterrupt within INTERRUPT_POLL_S, as
the main thread's would, and no candidate's partial result is ever handed back.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

STAGES = ("plan", "load", "verify", "profile")
INTERRUPT_POLL_S = 0.2   # how often a wait looks whether the pipeline was interrupted
PLANNER_GPU_BYTES = 1 << 30   # a planner's CUDA context (or Python) and Triton's working set, besides the inputs
PLANNER_MEMORY_SHARE = 0.4    # of the memory the planners keep inputs in, at most, for them


def planner_bytes(target) -> int:
    """Memory one planner holds at full size: its context, the target's inputs and outputs (its forward makes
    them) and the candidate's copy of the weights (an 8 GiB MLP exists)."""
    return PLANNER_GPU_BYTES + target.io_bytes(False) + target.state_bytes(False)


def planners_memory(devices: int, deviceless: bool) -> int:
    """What the planners may hold at once: PLANNER_MEMORY_SHARE of the host's memory where they plan without a
    device (sandbox/pool.py), else of the GPUs'."""
    if deviceless:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * PLANNER_MEMORY_SHARE)
    import torch

    return int(torch.cuda.get_device_properties(0).total_memory * PLANNER_MEMORY_SHARE) * devices


class MemoryGate:
    """Bytes of memory the planners may hold at once (planner_bytes each): at KernelBench's full sizes (12 GB of
    inputs for a ReLU) a dozen planners at once would run the host or the GPU out of memory. Each
    plan takes its share before it starts (at most the whole budget, so one always runs) and gives it back when it is
    done."""

    def __init__(self, budget: int | None) -> None:
        self.budget, self.free = budget, budget
        self._cond = threading.Condition()

    def need(self, evaluation) -> int:
        """What planning this evaluation's candidate takes (0 without a budget: no GPU)."""
        if self.budget is None:
            return 0
        return min(self.budget, planner_bytes(evaluation.target))

    def take(self, nbytes: int) -> None:
        if self.budget is None:
            return
        with self._cond:
            self._cond.wait_for(lambda: self.free >= nbytes)
            self.free -= nbytes

    def give(self, nbytes: int) -> None:
        if self.budget is None:
            return
        with self._cond:
            self.free += nbytes
            self._cond.notify_all()


def lend(session, device) -> bool:
    """Another session's idle device takes this session's candidates too, beside its own devices (a suite's lane
    with no problem left lends its GPU to a lane still running). Its evaluations bind it as any device (one
    candidate at a time: Device.lock). A session with nothing submitted yet gets it in its devices, which its
    pipeline starts with. False where the session is closing."""
    pipeline = session._pipeline
    if getattr(session, "closed", False) or pipeline is not None and pipeline._closing:
        return False
    session.devices.append(device)
    if pipeline is not None:
        pipeline.add_device(device)
    return True


class DeviceLost(Exception):
    """The device went away mid-candidate (its node died): the candidate is evaluated again on another one."""


class Submitted:
    """One candidate in flight: the staged calls of sandbox.evaluate.Evaluation (assemble = plan + load, verify,
    profile), each waiting until the background has done that stage. `times` holds when each step happened
    (time.perf_counter): submitted, plan_start, planned, device_start, device_end."""

    pipelined = True

    def __init__(self, pipeline: "Pipeline", evaluation, seq: int) -> None:
        self.pipeline, self.evaluation, self.seq = pipeline, evaluation, seq
        self.times: dict[str, float] = {"submitted": time.perf_counter()}
        self.device = None
        self.cancelled = False
        self.error: BaseException | None = None
        self._stages = {stage: threading.Event() for stage in STAGES}
        self._closed = False

    @property
    def result(self):
        return self.evaluation.result

    def assemble(self):
        return self._wait("load")

    def verify(self):
        return self._wait("verify")

    def profile(self):
        return self._wait("profile")

    def done(self) -> bool:
        return self._stages["profile"].is_set()

    def rejudge(self) -> None:
        """Time this (verified, timed) candidate against the session's standing best again, before any waiting
        candidate: the best changed since it was profiled."""
        self._wait("profile")
        self.pipeline.rejudge(self)

    def adopt_as_best(self, attempt: int | None) -> None:
        self.evaluation.adopt_as_best(attempt)

    def _wait(self, stage: str):
        self.pipeline.wait(self._stages[stage])
        if self.error is not None:  # a bug of ours in a background thread surfaces in the caller's
            raise self.error
        return self.evaluation.result

    def _set(self, *stages: str) -> None:
        for stage in stages or STAGES:
            self._stages[stage].set()

    def close(self) -> None:
        """Done with it: its plans are removed. One still queued is dropped; one in a planner or on a device is
        closed by that thread when it finishes."""
        with self.pipeline._cond:
            if self._closed:
                return
            self.cancelled = True
            if self in self.pipeline._ready:  # planned, never started on a device
                self.pipeline._ready.remove(self)
                heapq.heapify(self.pipeline._ready)
            elif "plan_start" not in self.times or ("device_end" not in self.times and not self.done()):
                return  # the planner or device thread that has it (or will look at it) closes it
            self._closed = True
        self.evaluation.close()
        self._set()

    def __lt__(self, other: "Submitted") -> bool:  # the ready queue orders by submission
        return self.seq < other.seq

    def __enter__(self) -> "Submitted":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Pipeline:
    """The planner threads and the device threads of one Session (see the module docstring)."""

    def __init__(self, session) -> None:
        self.session = session
        self._cond = threading.Condition()
        self._ready: list[Submitted] = []          # planned, waiting for a device; a heap by submission number
        self._urgent: collections.deque = collections.deque()   # (job, done event): re-judgements
        self._planning: set[Submitted] = set()
        self._closing = False
        self.interrupted = False
        self._seq = itertools.count(1)
        self._planners = ThreadPoolExecutor(max_workers=session.planners, thread_name_prefix="kloop-planner")
        self.memory = MemoryGate(session.planning_memory())
        self._devices: list[threading.Thread] = []
        self.lost = 0   # candidates taken back from a lost device
        for device in session.devices:
            self.add_device(device)

    def add_device(self, device) -> None:
        """One more device takes candidates (a replacement for a lost one)."""
        thread = threading.Thread(target=self._device_loop, args=(device,), daemon=True,
                                  name=f"kloop-device-{device.name}")
        with self._cond:
            self._devices.append(thread)
        thread.start()

    def submit(self, evaluation) -> Submitted:
        if self.interrupted:
            raise KeyboardInterrupt
        job = Submitted(self, evaluation, next(self._seq))
        self._planners.submit(self._plan, job)
        return job

    def interrupt(self) -> None:
        """For good: every wait on a stage or a re-judgement, now or within INTERRUPT_POLL_S, raises
        KeyboardInterrupt, and so does submit. What the planners and devices are doing goes on until the session
        closes (and kills it); the candidates' state is left alone, so closing them stays as safe as ever."""
        self.interrupted = True

    def wait(self, event: threading.Event) -> None:
        """event.wait(), but KeyboardInterrupt once the pipeline is interrupted."""
        while not event.wait(INTERRUPT_POLL_S):
            if self.interrupted:
                raise KeyboardInterrupt
        if self.interrupted:
            raise KeyboardInterrupt

    # -- planning ------------------------------------------------------------------------------------------------
    def _plan(self, job: Submitted) -> None:
        with self._cond:
            if job.cancelled or self._closing:
                job._closed = True
                dropped = True
            else:
                dropped = False
                job.times["plan_start"] = time.perf_counter()
                self._planning.add(job)
        if dropped:
            job.evaluation.close()
            job._set()
            return
        need = self.memory.need(job.evaluation)
        self.memory.take(need)
        try:
            job.evaluation.plan()
        except BaseException as e:  # noqa: BLE001 (re-raised in the thread that waits for the stage)
            job.error = e
        finally:
            self.memory.give(need)
        job.times["planned"] = time.perf_counter()
        with self._cond:
            self._planning.discard(job)
            if job.cancelled or self._closing or job.error is not None or job.result.verdict is not None:
                finished = True  # nothing for a device to do
            else:
                finished = False
                job._set("plan")
                heapq.heappush(self._ready, job)
                self._cond.notify_all()
        if finished:
            job.times["device_end"] = job.times["planned"]
            self._finish(job)

    # -- devices -------------------------------------------------------------------------------------------------
    def _device_loop(self, device) -> None:
        while True:
            with self._cond:
                while not self._closing and not self._urgent and not self._ready:
                    self._cond.wait()
                if self._closing:
                    return
                if self._urgent:
                    job, done = self._urgent.popleft()
                else:
                    job, done = heapq.heappop(self._ready), None
                    job.times["device_start"] = time.perf_counter()
                    job.device = device
            if done is not None:
                try:
                    job.evaluation.versus_standing_best(device)
                except DeviceLost:
                    with self._cond:
                        self._urgent.appendleft((job, done))
                        self._cond.notify_all()
                    return self._device_lost(device)
                except BaseException as e:  # noqa: BLE001
                    job.error = e
                done.set()
                continue
            if not self._run(device, job):
                return self._device_lost(device)

    def _device_lost(self, device) -> None:
        """This device's thread ends; the session may offer a replacement. With no device left, what waits fails."""
        replacement = self.session.device_lost(device) if hasattr(self.session, "device_lost") else None
        with self._cond:
            self._devices.remove(threading.current_thread())
            alone = not self._devices and replacement is None
            stranded, urgent = (list(self._ready), list(self._urgent)) if alone else ([], [])
            if alone:
                self._ready.clear()
                self._urgent.clear()
        if replacement is not None:
            self.add_device(replacement)
        for job in stranded:
            job.error = RuntimeError("every device of the session was lost")
            job.times["device_end"] = time.perf_counter()
            self._finish(job)
        for job, done in urgent:
            job.error = RuntimeError("every device of the session was lost")
            done.set()

    def _run(self, device, job: Submitted) -> bool:
        """The device phase of one candidate; False when the device was lost (the candidate is queued again)."""
        ev = job.evaluation
        try:
            ev.bind(device)
            job._set("plan")
            ev.load()
            job._set("load")
            ev.verify()
            job._set("verify")
            ev.profile()
        except DeviceLost:
            with self._cond:
                self.lost += 1
                job.times.pop("device_start", None)
                job.device = None
                ev.result.flags.append(f"device_lost: {device.name} went away mid-evaluation; evaluated again")
                heapq.heappush(self._ready, job)
                self._cond.notify_all()
            return False
        except BaseException as e:  # noqa: BLE001
            job.error = e
        finally:
            try:
                ev.release_device()
            except BaseException as e:  # noqa: BLE001
                job.error = job.error or e
            if "device_start" in job.times:  # not handed back to the queue
                durations = ev.result.durations_s
                durations["queued"] = round(job.times["device_start"] - job.times["planned"], 3)
                durations["device"] = device.name
                # The SASS listing (a disassembly on the CPU) is joined on a thread of its own: the device takes
                # the next candidate meanwhile. Until it is done (device_end) the job is neither done nor closed.
                threading.Thread(target=self._complete, args=(job,), daemon=True,
                                 name=f"kloop-complete-{job.seq}").start()
        return True

    def _complete(self, job: Submitted) -> None:
        try:
            if hasattr(job.evaluation, "collect_sass"):
                job.evaluation.collect_sass()
        except BaseException as e:  # noqa: BLE001
            job.error = job.error or e
        job.times["device_end"] = time.perf_counter()
        self._finish(job)

    def _finish(self, job: Submitted) -> None:
        if hasattr(job.evaluation, "account"):
            job.evaluation.account()
        job.evaluation.result.durations_s["waiting"] = round(
            job.times.get("plan_start", job.times["submitted"]) - job.times["submitted"], 3)
        close = False
        with self._cond:
            if job.cancelled and not job._closed:
                job._closed = close = True
        if close:
            job.evaluation.close()
        job._set()

    def rejudge(self, job: Submitted) -> None:
        done = threading.Event()
        with self._cond:
            if self.interrupted:
                raise KeyboardInterrupt
            if self._closing:
                return
            self._urgent.append((job, done))
            self._cond.notify_all()
        self.wait(done)
        if job.error is not None:
            raise job.error

    def close(self) -> None:
        """Stop: queued candidates are dropped, planners running candidates are killed, device threads end after
        the call in flight (the session then closes the devices' processes)."""
        with self._cond:
            self._closing = True
            dropped = list(self._ready)
            self._ready.clear()
            planning = list(self._planning)
            self._cond.notify_all()
        for job in dropped:
            job.evaluation.close()
            job._set()
        for job in planning:
            job.evaluation.abandoned = True  # a planner not yet acquired is closed as soon as it is
            planner = job.evaluation.planner
            if planner is not None:
                planner.kill()
        for _, done in list(self._urgent):
            done.set()
        self._planners.shutdown(wait=True)  # candidates not yet planned are dropped by _plan, which sees _closing
