"""Turn what kloop knows into prompts, and model answers back into candidates.

The wording lives in agent/prompts/*.j2; this module only gathers the facts those templates show. A request is
built from a stable prefix (system prompt + target, cached by providers that cache) and one turn message that carries
the evidence: older attempts as one-line summaries, the last `keep_full` attempts in full, so an 8-hour run's context
stays bounded while the log still holds every request whole.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from agent.policy import AttemptView, ProposeContext
from tools.result import Counters, Resources
from tools.rules import ALLOWED_IMPORTS, detect_language

LANGUAGES = ("triton", "ptx")
# Compiler logs and stderr can be megabytes (a Triton traceback, ptxas on a huge kernel): keep head and tail.
MAX_LOG_CHARS = 4000

_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "prompts"),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=False,
)


def _render(template: str, **values) -> str:
    text = _templates.get_template(template).render(**values)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


@dataclass
class Candidate:
    language: str
    source: str
    rationale: str


# -- prompts ---------------------------------------------------------------------------------------------------------
def system_prompt(language: str = "auto", tools: bool = True) -> str:
    """The instructions and rules; the same for every request of a run (cacheable)."""
    languages = "Triton or PTX" if language == "auto" else ("PTX" if language == "ptx" else "Triton")
    return _render("system.md.j2", tools=tools, languages=languages,
                   allowed_imports=", ".join(sorted(ALLOWED_IMPORTS)))


def hardware_text(gpu: dict | None) -> str:
    if not gpu:
        return ("no GPU: interpreter. Candidates run in the Triton CPU interpreter on a small problem; PTX cannot run "
                "and is only assembled. No timing is real, so aim for correctness and a design that would be fast.")
    parts = [gpu.get("name") or "unknown GPU"]
    if gpu.get("sms"):
        parts.append(f"{gpu['sms']} SMs")
    if gpu.get("cc"):
        parts.append(f"compute capability {gpu['cc']}")
    if gpu.get("peak_gbps"):
        parts.append(f"peak DRAM bandwidth {gpu['peak_gbps']:.0f} GB/s")
    for key, label in (("peak_tflops_bf16", "bf16"), ("peak_tflops_fp32", "fp32")):
        if gpu.get(key):
            parts.append(f"peak {label} {gpu[key]:.0f} TFLOP/s")
    if gpu.get("l2_bytes"):
        parts.append(f"L2 {gpu['l2_bytes'] / 2**20:.0f} MiB")
    return ", ".join(parts) + "."


def target_prompt(ctx: ProposeContext) -> str:
    """The target, the hardware and the language: stable for a whole run (cacheable)."""
    return _render("target.md.j2", name=ctx.target_name, source=ctx.target_source.strip(),
                   hardware=hardware_text(ctx.gpu), language=ctx.language, lessons=ctx.lessons)


def turn_prompt(ctx: ProposeContext, keep_full: int = 4) -> str:
    """This turn's evidence: summaries of older attempts, the last keep_full in full, the best kernel, the budget."""
    history = ctx.history
    older, recent = (history[:-keep_full], history[-keep_full:]) if keep_full > 0 else (history, [])
    best = _facts(ctx.best) if ctx.best else None
    # The best kernel's source stays in view even after it has scrolled out of the recent attempts.
    shown = {v.id for v in recent} | ({ctx.parent.id} if ctx.parent else set())
    best_report = attempt_report(ctx.best) if ctx.best and ctx.best.id not in shown else ""
    # The strategy's parent (agent/strategies): named, and in full unless it is one of the latest attempts shown.
    parent = ctx.parent if ctx.parent and ctx.parent.id not in {v.id for v in recent} else None
    return _render(
        "turn.md.j2", turn=ctx.turn, branch=ctx.branch, budget=_budget_text(ctx.budget_left), best=best,
        parent_number=ctx.parent.number if ctx.parent else None,
        parent_report=attempt_report(parent) if parent else "",
        parent_reason=ctx.parent_reason,
        best_report=best_report, summaries=[attempt_summary(view) for view in older],
        reports=[attempt_report(view) for view in recent], history_empty=not history)


def attempt_report(view: AttemptView) -> str:
    """Everything the evaluator learned about one attempt, with its source, as the model should read it."""
    return _render("attempt.md.j2", a=_facts(view))


def attempt_summary(view: AttemptView) -> str:
    """One line: what was tried and what it gave."""
    line = f"#{view.number} {view.language} {view.verdict}"
    if view.speedup_eager is not None:
        line += f", {view.speedup_eager:.2f}x eager"
    if view.time_us is not None:
        line += f", {view.time_us:.1f} us"
    if view.sol_fraction is not None:
        line += f", {view.sol_fraction:.0%} of speed of light"
    # A failure's first reason says what went wrong; a success's diagnosis says what limits it.
    detail = view.reasons[0] if view.verdict != "correct" and view.reasons else view.diagnosis
    if detail:
        line += f": {_one_line(detail, 160)}"
    return line


def _budget_text(budget: dict) -> str:
    labels = {"attempts": "{:.0f} attempts", "seconds": "{:.0f} s", "cost": "${:.2f}", "cost_usd": "${:.2f}"}
    return ", ".join(labels.get(key, key + " {}").format(value) for key, value in budget.items() if value is not None)


def _facts(view: AttemptView) -> dict:
    """The evaluator result flattened to short strings; anything missing is left out, never shown as None."""
    result = view.result
    facts = {"number": view.number, "language": view.language, "verdict": view.verdict,
             "reasons": list(view.reasons or []), "diagnosis": view.diagnosis, "source": view.source.strip(),
             "flags": ", ".join(result.flags)}
    note = result.timing_note or ""
    facts["timing_note"] = note if note not in view.diagnosis else ""
    timing = result.time_us
    if timing:
        facts["time"] = (f"median {timing.median:.2f} us (IQR {timing.q1 or 0:.2f}-{timing.q3 or 0:.2f}, "
                         f"min {timing.min or 0:.2f}, n={timing.n or '?'})")
    elif view.time_us is not None:
        facts["time"] = f"median {view.time_us:.2f} us"
    else:
        facts["time"] = ""
    speedups = [f"{value:.2f}x over {name}" for name, value in
                (("eager", view.speedup_eager), ("torch.compile", view.speedup_compile)) if value is not None]
    facts["speedup"] = ", ".join(speedups)
    if result.vs_best:
        vs = result.vs_best
        facts["speedup"] += (f"; against the best so far, re-timed side by side: {vs.ratio:.3f}x "
                             f"(95% CI {vs.ci_low:.3f}-{vs.ci_high:.3f}), {vs.outcome}")
    roofline = result.roofline
    if view.sol_fraction is not None and roofline:
        facts["roofline"] = (f"{view.sol_fraction:.0%} ({roofline.bound or '?'}-bound; floor "
                             f"{_num(roofline.sol_us)} us for {_num(roofline.bytes)} bytes, "
                             f"{_num(roofline.flops)} FLOP)")
    else:
        facts["roofline"] = ""
    correctness = result.correctness
    if correctness:
        error = f"max abs error {correctness.max_abs_err:.3g}, max rel error {correctness.max_rel_err:.3g}"
        if correctness.worst:
            error += f"; worst: {_one_line(str(correctness.worst), 300)}"
        facts["error"] = error
    else:
        facts["error"] = ""
    # A kernel with no numbers (a CPU interpreter run) says nothing worth a line.
    facts["resources"] = [line for line in map(_resource_line, result.resources) if ": " in line]
    nvml = result.nvml or {}
    facts["throttle"] = (f"throttled during timing ({', '.join(nvml.get('reasons') or ['reason unknown'])}): "
                         "timings may be pessimistic") if nvml.get("throttled") else ""
    facts["ncu"] = [f"{name}: {_ncu_line(counters)}" for name, counters in (result.ncu or {}).items()]
    facts["compile_log"] = _clip(result.compile_log or "") if view.verdict == "compile_error" else ""
    facts["stderr"] = _clip(result.stderr or "") if view.verdict == "runtime_error" else ""
    return facts


def _resource_line(r: Resources) -> str:
    parts = [r.kernel]
    for value, label in ((r.registers, "registers"), (r.spills, "spilled words"), (r.shared_bytes, "shared bytes"),
                         (r.num_warps, "warps"), (r.num_stages, "stages"), (r.threads, "threads")):
        if value is not None:
            parts.append(f"{value} {label}")
    if r.occupancy is not None:
        parts.append(f"occupancy {r.occupancy:.0%}")
    return ": ".join([parts[0], ", ".join(parts[1:])]) if len(parts) > 1 else parts[0]


def _ncu_line(counters: Counters) -> str:
    parts = []
    for value, label in ((counters.dram_pct, "DRAM"), (counters.sm_pct, "SM"), (counters.l2_hit_pct, "L2 hit"),
                         (counters.achieved_occupancy_pct, "achieved occupancy")):
        if value is not None:
            parts.append(f"{label} {value:.0f}%")
    if counters.gpu_time_us is not None:
        parts.append(f"{counters.gpu_time_us:.2f} us")
    if counters.stalls:
        top = sorted(counters.stalls.items(), key=lambda kv: -(kv[1] or 0))[:3]
        parts.append("top stalls (warps stalled per issued instruction) " + ", ".join(f"{k} {v:.2f}" for k, v in top))
    return ", ".join(parts)


def _num(value) -> str:
    if value is None:
        return "?"
    return f"{value:.3g}" if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else str(value)


def _one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _clip(text: str, limit: int = MAX_LOG_CHARS) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"


def lessons_prompt(digest, max_lessons: int = 3) -> str:
    """The one request a model policy sends after a run to distil lessons and judge the lessons it was shown."""
    best = digest.best
    best_text = (f"{best.number} ({best.language}" + (f", {best.speedup_eager:.2f}x eager" if best.speedup_eager
                                                     is not None else "") + ")") if best else ""
    return _render("lessons.md.j2", name=digest.target_name, features=digest.features,
                   attempts=[attempt_summary(a) for a in digest.attempts], best=best_text,
                   shown=digest.shown_lessons, max_lessons=max_lessons)


def lessons_from_text(text: str) -> tuple[list[dict], list[dict]]:
    """(lessons, judgements) from the model's answer to lessons_prompt: the first JSON object in it; ([], []) when
    there is none. Malformed entries are dropped."""
    import json

    decoder = json.JSONDecoder()
    for start in [m.start() for m in re.finditer(r"\{", text or "")]:
        try:
            body, _ = decoder.raw_decode(text[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(body, dict) and ("lessons" in body or "judgements" in body):
            break
    else:
        return [], []
    lessons = [{"text": item["text"], "evidence": [n for n in item.get("evidence") or [] if isinstance(n, int)]}
               for item in body.get("lessons") or [] if isinstance(item, dict) and isinstance(item.get("text"), str)]
    judgements = [{"id": item["id"], "verdict": str(item.get("verdict", "")), "why": str(item.get("why") or "")}
                  for item in body.get("judgements") or [] if isinstance(item, dict) and isinstance(item.get("id"), int)]
    return lessons, judgements


# -- answers ---------------------------------------------------------------------------------------------------------
def candidate_from_submission(arguments: dict) -> tuple[Candidate | None, str]:
    """The submit_candidate tool's input as a candidate, or the one-line reason it is unusable."""
    if not isinstance(arguments, dict):
        return None, "submit_candidate input is not an object"
    source = arguments.get("source")
    if not isinstance(source, str) or not source.strip():
        return None, "submit_candidate was called without a source (the whole module defining ModelNew)"
    language = arguments.get("language") or detect_language(source)
    if language not in LANGUAGES:
        return None, f"submit_candidate language {language!r} is not one of {', '.join(LANGUAGES)}"
    rationale = arguments.get("rationale")
    return Candidate(language, source, rationale if isinstance(rationale, str) else ""), ""


_FENCE = re.compile(r"```[ \t]*(python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_MARKER = re.compile(r"^[ \t]*#[ \t]*language:[ \t]*(\w+)", re.MULTILINE | re.IGNORECASE)


def candidate_from_text(text: str) -> tuple[Candidate | None, str]:
    """A candidate from a plain-text answer: the last fenced Python block that defines ModelNew.

    The language comes from a `# language: ptx` marker in the block, else from its content.
    """
    blocks = [body for _, body in _FENCE.findall(text or "") if "ModelNew" in body]
    if not blocks:
        return None, "the answer has no ```python block defining ModelNew"
    source = blocks[-1].strip() + "\n"
    marker = _MARKER.search(source)
    language = marker.group(1).lower() if marker else detect_language(source)
    if language not in LANGUAGES:
        return None, f"the language marker says {language!r}, not one of {', '.join(LANGUAGES)}"
    rationale = _FENCE.sub("", text).strip()
    return Candidate(language, source, rationale), ""


# -- export ----------------------------------------------------------------------------------------------------------
def export_prompts():
    """The wording tools.records.export uses to rebuild an offline-policy run as the conversation a model would have had."""
    from agent.inspect_tools import SUBMIT, TOOLS, openai_tools
    from tools.records.export import Prompts
    from tools.records.store import Attempt, best_after

    def turn(run: dict, gpu: dict | None, history: list[Attempt], number: int) -> str:
        views = [AttemptView.of(attempt) for attempt in history]
        best_then = best_after(history)   # the best as the loop held it then, by its own rule
        best = next(v for v in views if v.id == best_then.id) if best_then else None
        ctx = ProposeContext(run_id=run["id"], branch=views[-1].branch if views else 0, turn=number,
                             target_name=run.get("target_name") or "", target_source=run.get("target_source") or "",
                             language=(run.get("settings") or {}).get("language") or "auto", gpu=gpu, history=views,
                             best=best)
        return target_prompt(ctx) + "\n" + turn_prompt(ctx)

    return Prompts(system=lambda language, tools: system_prompt(language, tools=tools), turn=turn,
                   submit_tool=openai_tools([t for t in TOOLS if t["name"] == SUBMIT])[0])
