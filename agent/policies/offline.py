"""The offline policy: no model, no network. Starts from known-good kernels, then searches around the best one.

Starters: the catalog's for a built-in target, else a --seed-kernel, else the Triton torch.compile (Inductor)
generates for the target's reference, made standalone (agent/kernels/inductor.py; generated once per run in a child
process and pinned in the run's settings as `inductor_starter`, so a resumed run searches the same starter).

Order of moves, deterministic given the run (but for PTX moves passed over while their compile runs, below): (0)
tunables remembered from a similar target (tools/records/memory.py), first with their row tiles (Inductor's R0_BLOCK, the
catalog's BLOCK_COLS) scaled from the row length they were tuned at to this target's, then as remembered; (1) every
starter for the target (branch b starts at the b-th); (2) around the search strategy's parent (agent/strategies;
under refine that is the best attempt so far), then the best, then the next best, then any earlier attempt (other
strategies: then the run's other verified attempts): one tunable one step up or down its list, the step chosen from
the reflect node's diagnosis, then two steps; PTX edits of a Triton attempt's PTX (cache hints) come between the two
when the kernel is memory-bound below 80% of bandwidth, last otherwise (where the anchor has no PTX twin, the fastest
attempt with one gets its PTX moves after the anchor's one-step moves); they compile the attempt's Triton source for
the target's main shape in a subprocess (once per source, started on a thread when the attempt becomes the anchor
with a PTX twin; while it compiles and attempts are in flight, its PTX moves are passed over until it is done, and
Proposal.wait asks the loop to come back when nothing else is left; specialized and generic PTX, see
agent/kernels/ptx_edits.py). A source already tried (by hash) is never proposed again. Each candidate's first line
records its starter and values, so the search can resume from any attempt in the database. When the Inductor starter
and its first neighbours pass the main shape but all fail a hidden variant, the policy stops and says why:
torch.compile fixed a size the variants change, which no tunable undoes.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from agent.diagnose import diagnose
from agent.kernels.constants import constants, replace_constants
from agent.policy import AttemptView, Message, PolicyError, Proposal, ProposeContext
from tools.rules import detect_language
from tools.records.store import OFFLINE_MARK, Store, fastest_key, offline_marker, source_hash

FIXED_SIZE_ATTEMPTS = 3   # Inductor attempts failing only at hidden variants before the policy stops searching
ROW_TILE = re.compile(r"(^|_)R0_BLOCK$|^BLOCK_COLS$")   # a tile along the row a kernel reduces
NO_STARTERS = ("the offline policy needs a target or a seed kernel; give --seed-kernel FILE or use an LLM policy "
               "(--policy anthropic|openai)")


@dataclass
class Template:
    """A kernel with named tunables: a catalog starter, or a user's seed kernel."""
    name: str
    language: str
    tunables: dict[str, list]
    defaults: dict[str, Any]
    notes: str
    starter: Any = None          # the catalog Starter, rendered by the catalog
    seed_source: str = ""        # a seed kernel or Inductor's starter, rendered by replacing its constants' values
    ptx_twin: bool = True        # its compiled PTX can become a PTX candidate (the catalog's launch convention)

    def render(self, values: dict) -> str:
        if self.starter is not None:
            from agent.kernels import catalog
            body = catalog.render(self.starter, values)
        else:
            body = replace_constants(self.seed_source, values)
        return OFFLINE_MARK + json.dumps({"template": self.name, "values": values}, sort_keys=True) + "\n" + body


@dataclass
class Move:
    source: str
    language: str
    reasoning: str


class OfflinePolicy:
    name = "offline"
    model = ""

    def __init__(self, target=None, seed_kernel: str | Path | None = None, store: Store | None = None,
                 remembered: list[dict] | None = None, inductor_starter: dict | None = None):
        """target: a tools.target.Target; store (optional) lets parallel branches see each other's sources;
        remembered: tuning memory (tools.records.memory.Memory.seeds): {template, values, ...} tried before the starters;
        inductor_starter: an Inductor starter generated before (agent.kernels.inductor.Generated.to_dict()), used
        instead of generating one. `pinned`: the settings to store with the run so a resume searches the same."""
        self.pinned: dict = {}
        if seed_kernel is None and target is not None and not (target.builtin and _catalog_starters(target)):
            template, generated = inductor_template(target, inductor_starter)
            self.templates = [template]
            self.pinned = {"inductor_starter": generated}
        elif seed_kernel is not None:
            self.templates = [seed_template(Path(seed_kernel))]
        elif target is not None and target.builtin:
            from agent.kernels import catalog
            self.templates = [Template(s.name, s.language, s.tunables, catalog.default_values(s), s.notes, starter=s,
                                       ptx_twin=s.ptx_twin)
                              for s in catalog.starters_for(target.name)]
        else:
            self.templates = []
        if not self.templates:
            raise PolicyError(NO_STARTERS)
        self.by_name = {t.name: t for t in self.templates}
        self.target = target
        # Triton source hash -> its PTX compilations ([] when compiling failed), started ahead (prefetch) on a
        # thread: a compile takes seconds, and a propose that waits for it stops the whole pipeline meanwhile.
        self.compiled: dict[str, Future] = {}
        self._compiler = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kloop-ptx-twin")
        self.store = store
        self.claimed: set[str] = set()   # proposed by this process but maybe not yet committed (parallel branches)
        self.remembered = [r for r in remembered or [] if r.get("template") in self.by_name]
        self.lock = threading.Lock()
        self.compiling: list | None = None   # PTX twins passed over while compiling (None: wait for them)

    def propose(self, ctx: ProposeContext) -> Proposal:
        fixed = self.fixed_size(ctx.history)
        if fixed:
            return Proposal("triton", "", fixed, done=True)
        if self.store is not None:   # every branch's attempts (the history shown may be a part of them)
            tried = {a.source_hash for a in self.store.history(ctx.run_id)}
        else:
            tried = {source_hash(a.source) for a in ctx.history}
        with self.lock:
            # With attempts in flight, the PTX moves of a twin still compiling are passed over for now (they come
            # back in their place once it is done) and, when nothing else is left, the loop is asked to come back
            # after its next log (Proposal.wait). With none in flight, the compile is waited for.
            self.compiling = [] if ctx.in_flight > 0 else None
            move = self.first_untried(ctx, tried)
            if move is None and self.compiling:
                return Proposal("ptx", "", "the anchor's PTX twin is still compiling", wait=True)
            if move is not None:
                self.claimed.add(source_hash(move.source))
                return Proposal(move.language, move.source, move.reasoning,
                                [Message(role="response", provider="offline", content={"reasoning": move.reasoning})])
        return Proposal(ctx.language if ctx.language != "auto" else "triton", "",
                        "Every starter and every neighbour of every attempt has been tried.", done=True)

    def first_untried(self, ctx: ProposeContext, tried: set[str]) -> Move | None:
        for move in self.moves(ctx):
            digest = source_hash(move.source)
            if digest not in tried and digest not in self.claimed:
                return move
        return None

    @staticmethod
    def fixed_size(history: list[AttemptView]) -> str:
        """Why searching on is pointless, when it is: the Inductor starter and its first neighbours all pass the
        main shape and fail a hidden variant. torch.compile then fixed a size the variants change (one that a module
        fixes at construction); its kernels take no other, and no tunable changes that."""
        tried = [a for a in history if (offline_marker(a.source) or {}).get("template", "").startswith("inductor/")]
        if len(tried) < FIXED_SIZE_ATTEMPTS or any(a.verdict == "correct" for a in tried):
            return ""
        if not all(a.reasons and a.reasons[0].startswith("hidden variant") for a in tried):
            return ""
        return (f"the Inductor starter and {len(tried) - 1} of its neighbours pass the main shape and fail a hidden "
                "variant: torch.compile fixed a size of the main shape in its kernels, which no tunable changes "
                "(a seed kernel or an LLM policy is needed)")

    def reflect(self, ctx: ProposeContext, attempt: AttemptView) -> tuple[str, list[Message]]:
        return "", []

    # -- candidate order ---------------------------------------------------------------------------------------
    def moves(self, ctx: ProposeContext) -> Iterator[Move]:
        allowed = {"triton", "ptx"} if ctx.language == "auto" else {ctx.language}
        for memory in self.remembered:  # what won on a similar target before: tried first
            t = self.by_name[memory["template"]]
            values = {**t.defaults, **{k: v for k, v in (memory.get("values") or {}).items()
                                       if k in t.tunables and v in t.tunables[k]}}
            if t.language not in allowed:
                continue
            why = memory.get("why", "a similar target")
            old_row, new_row = memory.get("row_length"), memory.get("to_row_length")
            scaled = scale_row_tiles(values, t.tunables, old_row, new_row)
            if scaled != values:
                yield Move(t.render(scaled), t.language,
                           f"Start from the {t.name} {t.language} kernel with the tunables that won before, its row "
                           f"tiles scaled from rows of {old_row} to {new_row} ({format_values(scaled)}; memory: {why}).")
            yield Move(t.render(values), t.language,
                       f"Start from the {t.name} {t.language} kernel with the tunables that won before "
                       f"({format_values(values)}; memory: {why}).")
        offset = ctx.branch % len(self.templates)
        for t in self.templates[offset:] + self.templates[:offset]:
            if t.language in allowed:
                yield Move(t.render(t.defaults), t.language,
                           f"Start from the {t.name} {t.language} kernel with its default settings "
                           f"({format_values(t.defaults)}). {t.notes}".strip())
        ranked = anchors(ctx, self.run_attempts(ctx))
        # The fastest attempt that has a PTX twin: where the best has none (a TMA matmul's tensor descriptors), its
        # PTX moves come after the best's one-step moves, not after every better attempt's whole neighbourhood.
        twin = next((a for a in ranked if self.has_ptx_twin(a)), None) if "ptx" in allowed else None
        if twin is not None:  # compiled while the one-step moves before its PTX moves are evaluated
            self.prefetch(twin.source)
        for anchor in ranked:
            facts = diagnose(anchor.result)[1]
            about = describe(anchor)
            ptx_moves = self.ptx_moves(anchor, about) if "ptx" in allowed else iter(())
            # One-step tuning first: a better neighbour becomes the next anchor, so cache hints are tried on a
            # local optimum. Memory-bound kernels with room get them before the two-step moves, others after.
            yield from self.tuning_moves(anchor, facts, about, allowed, step=1, gpu=ctx.gpu)
            if twin is not None and not self.has_ptx_twin(anchor):
                yield from self.ptx_moves(twin, describe(twin))
                twin = None
            if facts.get("memory_room"):
                yield from ptx_moves
            yield from self.tuning_moves(anchor, facts, about, allowed, step=2, gpu=ctx.gpu)
            if not facts.get("memory_room"):
                yield from ptx_moves

    def tuning_moves(self, anchor: AttemptView, facts: dict, about: str, allowed: set, step: int,
                     gpu: dict | None = None) -> Iterator[Move]:
        """One tunable `step` places up or down its list, in the order the diagnosis prefers; configurations the
        starter says do not fit the GPU (shared memory, registers) are never proposed."""
        marker = offline_marker(anchor.source)
        template = self.by_name.get(marker.get("template")) if marker else None
        if template is None or template.language not in allowed or "ptx_edit" in marker:
            return
        values = marker["values"]
        for kind, direction, why in preferences(facts):
            for name, options in template.tunables.items():
                if tunable_kind(name) != kind or values.get(name) not in options:
                    continue
                i = options.index(values[name]) + direction * step
                if 0 <= i < len(options):
                    new = {**values, name: options[i]}
                    fits = template.starter.fits if template.starter is not None else None
                    if fits is not None and fits({**template.defaults, **new}, gpu):
                        continue
                    yield Move(template.render(new), template.language,
                               f"{about} Next: {name} {values[name]} -> {options[i]}, {why}.")

    def has_ptx_twin(self, attempt: AttemptView) -> bool:
        """A correct catalog Triton attempt that a GPU run compiled to one PTX module, of a template whose launch
        convention a PTX candidate can take over."""
        marker = offline_marker(attempt.source)
        return (attempt.language == "triton" and attempt.verdict == "correct" and bool(marker)
                and "ptx_edit" not in marker and marker.get("template") in self.by_name
                and self.by_name[marker["template"]].ptx_twin and self.target is not None
                and len(attempt.result.ptx) == 1)

    def ptx_moves(self, anchor: AttemptView, about: str) -> Iterator[Move]:
        """The anchor's kernel as a PTX candidate (specialized + generic PTX, compiled here for the main shape), then
        its cache-hint variants. Only for an attempt with a PTX twin (has_ptx_twin)."""
        if not self.has_ptx_twin(anchor):
            return
        marker = offline_marker(anchor.source)
        from agent.kernels import ptx_edits
        compiled = self.ptx_compilations(anchor.source)
        if not compiled:
            return

        def as_candidate(edit: str, variants: list) -> str:
            body = ptx_edits.ptx_candidate_from_triton(anchor.source, variants)
            return OFFLINE_MARK + json.dumps({**marker, "ptx_edit": edit}, sort_keys=True) + "\n" + body

        try:
            yield Move(as_candidate("none", compiled), "ptx",
                       f"{about} Next: launch its own PTX directly (no Triton launcher), to edit it from here.")
            edits = sorted({edit for c in compiled for edit in ptx_edits.cache_hint_variants(c.ptx)})
            for edit in edits:
                edited = [dataclasses.replace(c, ptx=ptx_edits.cache_hint_variants(c.ptx).get(edit, c.ptx))
                          for c in compiled]
                yield Move(as_candidate(edit, edited), "ptx",
                           f"{about} Next: PTX edit {edit} on its loads/stores, since streamed data should not "
                           f"displace reused lines in L2.")
        except ValueError:  # a kernel that does not follow the catalog's launch convention has no PTX twin
            return

    def run_attempts(self, ctx: ProposeContext) -> list[AttemptView]:
        """Under a strategy other than refine the context shows only part of the run: the run's other attempts
        are the last anchors, so the policy runs dry only when the whole run has been searched around."""
        if ctx.strategy == "refine" or self.store is None:
            return []
        return [AttemptView.of(attempt) for attempt in self.store.history(ctx.run_id)]

    def prefetch(self, source: str) -> Future:
        """Start compiling the Triton source to PTX for the target's main shape, once per source."""
        key = source_hash(source)
        if key not in self.compiled:
            self.compiled[key] = self._compiler.submit(self._compile, source)
        return self.compiled[key]

    def ptx_compilations(self, source: str) -> list:
        """The Triton source compiled to PTX for the target's main shape ([] if it does not compile, or, while this
        proposal passes over compiles in progress, not yet)."""
        future = self.prefetch(source)
        if not future.done() and self.compiling is not None:
            self.compiling.append(future)
            return []
        return future.result()

    def _compile(self, source: str) -> list:
        from agent.kernels import ptx_edits
        try:
            spec = self.target.name if self.target.builtin else str(self.target.path)
            return ptx_edits.compile_for_target(source, spec)
        except (RuntimeError, ValueError):
            return []


def anchors(ctx: ProposeContext, rest: list[AttemptView] = ()) -> list[AttemptView]:
    """Attempts to search around: the strategy's parent, then correct ones fastest first (the run's best leads), then
    all others newest first; then `rest` (the run's other attempts), correct ones fastest first."""
    seen, ordered = set(), []
    correct = sorted((a for a in ctx.history if a.verdict == "correct"), key=fastest_key)
    others = sorted((a for a in rest if a.verdict == "correct"), key=fastest_key)
    for a in (([ctx.parent] if ctx.parent else []) + ([ctx.best] if ctx.best else []) + correct
              + list(reversed(ctx.history)) + others):
        if a.id not in seen:
            seen.add(a.id)
            ordered.append(a)
    return ordered


def preferences(facts: dict) -> list[tuple[str, int, str]]:
    """(tunable kind, direction, why) in the order the diagnosis suggests, then every other combination."""
    default = [("tile", +1, "more work per program"), ("tile", -1, "a smaller tile"),
               ("warps", +1, "more warps to hide latency"), ("warps", -1, "fewer warps"),
               ("stages", +1, "deeper pipelining"), ("stages", -1, "fewer pipeline stages"),
               ("cache", +1, "another cache hint"), ("cache", -1, "another cache hint"),
               ("schedule", +1, "another schedule"), ("schedule", -1, "another schedule"),
               ("other", +1, "another loop structure"), ("other", -1, "another loop structure")]
    if facts.get("spilling"):
        first = [("tile", -1, "smaller tiles, since registers spill"), ("stages", -1, "fewer stages, since registers spill")]
    elif facts.get("low_occupancy") and facts.get("register_heavy"):
        first = [("warps", -1, "fewer warps, since register pressure limits occupancy"),
                 ("tile", -1, "a smaller block, since register pressure limits occupancy")]
    elif facts.get("memory_room"):
        first = [("tile", +1, "bigger blocks, since it is memory-bound below 80% of bandwidth"),
                 ("cache", +1, "another cache hint, since it is memory-bound below 80% of bandwidth"),
                 ("cache", -1, "another cache hint, since it is memory-bound below 80% of bandwidth"),
                 ("warps", +1, "more warps in flight, since it is memory-bound below 80% of bandwidth")]
    elif facts.get("bound") == "compute" and facts.get("tensor_busy"):
        first = [("schedule", +1, "to overlap the epilogue with the next tile's math, since the tensor pipe is busy"),
                 ("tile", +1, "bigger tiles, fewer edges and epilogues, since the tensor pipe is busy")]
    elif facts.get("bound") == "compute" and facts.get("waiting_on_loads"):
        first = [("stages", +1, f"deeper pipelining, since warps wait for their tiles ({facts.get('top_stall')})"),
                 ("schedule", +1, "a producer warp group or persistent programs, since warps wait for their tiles"),
                 ("tile", +1, "bigger tiles, more math per byte loaded, since warps wait for their tiles")]
    elif facts.get("bound") == "compute" and facts.get("shared_bound"):
        first = [("tile", +1, f"bigger tiles, more math per shared-memory byte ({facts.get('top_stall')})"),
                 ("warps", -1, "fewer warps sharing shared memory")]
    elif facts.get("bound") == "compute":
        first = [("tile", +1, "bigger tiles, more tensor-core work per byte loaded, since it is compute-bound"),
                 ("stages", +1, "more stages, since it is compute-bound"),
                 ("schedule", +1, "warp specialization or persistent programs, since it is compute-bound"),
                 ("warps", +1, "more warps, since it is compute-bound")]
    else:
        first = []
    firsts = {(k, d) for k, d, _ in first}
    return first + [p for p in default if (p[0], p[1]) not in firsts]


def tunable_kind(name: str) -> str:
    """What a tunable controls, from its name (tile words first: ELEMS_PER_THREAD is a tile, THREADS is not)."""
    lower = name.lower()
    if any(word in lower for word in ("evict", "qualifier", "cache")):
        return "cache"
    if any(word in lower for word in ("specialize", "subtile", "flatten", "programs_per", "persistent")):
        return "schedule"
    if any(word in lower for word in ("block", "tile", "rows", "size", "cols", "group", "split", "chunk", "elems")):
        return "tile"
    if "warp" in lower or "thread" in lower:
        return "warps"
    if "stage" in lower:
        return "stages"
    return "other"


def describe(a: AttemptView) -> str:
    marker = offline_marker(a.source)
    what = f"{marker['template']} with {format_values(marker['values'])}" if marker else f"a {a.language} kernel"
    if a.verdict != "correct":
        outcome = f"was {a.verdict}" + (f" ({a.reasons[0]})" if a.reasons else "")
    elif a.speedup_eager is not None:
        outcome = f"is correct at {a.speedup_eager:.2f}x over eager"
        outcome += f", {a.sol_fraction:.0%} of speed-of-light" if a.sol_fraction is not None else ""
    else:
        outcome = "is correct (no timing on this machine)"
    diagnosis = " ".join(a.diagnosis.split("\n")[:2]) if a.diagnosis else ""
    return f"Attempt {a.number} ({what}) {outcome}." + (f" Diagnosis: {diagnosis}." if diagnosis else "")


def scale_row_tiles(values: dict, tunables: dict[str, list], old_row: int | None, new_row: int | None) -> dict:
    """Remembered values with each row tile (ROW_TILE) scaled by new_row / old_row to the power of two nearest
    that ratio, then to the nearest value its list allows: a reduction tuned over rows of 8192 with tiles of 1024
    takes tiles of 2048 over rows of 16384. Unchanged without both row lengths."""
    if not old_row or not new_row or old_row == new_row:
        return values
    factor = 2.0 ** round(math.log2(new_row / old_row))
    scaled = dict(values)
    for name, value in values.items():
        allowed = [v for v in tunables.get(name, []) if isinstance(v, int) and not isinstance(v, bool)]
        if ROW_TILE.search(name) and isinstance(value, int) and allowed:
            want = value * factor
            scaled[name] = min(allowed, key=lambda v: (abs(math.log2(v / want)), v))
    return scaled


def format_values(values: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items()) or "no tunables"


# -- starters for any target ----------------------------------------------------------------------------------
def _catalog_starters(target) -> list:
    from agent.kernels import catalog
    return catalog.starters_for(target.name)


NO_STARTER_PREFIX = "no offline starter for "


def no_starter_message(target_name: str, reason: str) -> str:
    return (f"{NO_STARTER_PREFIX}{target_name}: {reason}; give --seed-kernel FILE or use an LLM policy "
            "(--policy anthropic|openai)")


def inductor_template(target, starter: dict | None = None) -> tuple[Template, dict]:
    """The Inductor starter of a target as a template (its K<i>_* constants are the tunables), and the starter as
    stored in the run's settings. Generated in a child process unless `starter` is given; PolicyError with the
    generator's one-line reason where there is none."""
    from agent.kernels import inductor

    if starter is None:
        try:
            generated = inductor.generate(target.name if target.builtin else str(target.path))
        except inductor.NoStarter as e:
            raise PolicyError(no_starter_message(target.name, str(e))) from None
    else:
        generated = inductor.Generated.from_dict(starter)
    template = Template(f"inductor/{target.name}", "triton", generated.tunables, generated.defaults, generated.notes,
                        seed_source=generated.source, ptx_twin=False)
    return template, generated.to_dict() if starter is None else starter


# -- seed kernels ------------------------------------------------------------------------------------------------
def seed_template(path: Path) -> Template:
    """A user's kernel: its UPPERCASE top-level constants (numbers, booleans) become tunables."""
    try:
        source = path.read_text()
        tree = ast.parse(source)
    except (OSError, SyntaxError, UnicodeDecodeError) as e:
        raise PolicyError(f"cannot read seed kernel {path}: {e}") from None
    defaults = {name: value for name, value, _node in constants(tree)}
    return Template(path.stem, detect_language(source), {k: neighbours(v) for k, v in defaults.items()}, defaults,
                    f"(your seed kernel {path.name})", seed_source=source)


def neighbours(value: int | float | bool) -> list:
    """Sorted candidate values around a constant: powers of two step by 2x, other numbers by about +-50%."""
    if isinstance(value, bool):
        return [False, True]
    if isinstance(value, float):
        return sorted({value / 2, value, value * 2})
    if value > 0 and value & (value - 1) == 0:
        return sorted({v for v in (value // 4, value // 2, value, value * 2, value * 4) if v >= 1})
    return sorted({v for v in (round(value * 0.5), round(value * 0.75), value, round(value * 1.5), value * 2)
                   if v >= 1} | {value})
