"""Memory across runs, around one run: what it is given before it starts, and what is kept after it ends.

    extra = prepare(settings, target, policy, gpu)   # before the policy is made: settings.update(extra)
    ... the run ...
    lines = after_run(store, run_id, policy, settings)

agent.run calls both, for every entry point (`start` and `run`), when the run's settings name a memory file.

Before: the offline policy gets the remembered tunables of its templates (tuning memory, nearest shape bucket on
this GPU); a model policy gets the top-k lessons for the target's features (FTS5). Both are stored in the run's
settings (memory_seeds, memory_lessons), so a resumed run is shown the same. After: the verified attempts' tunables
are kept per (template, shape bucket, GPU), and a policy with `distill` writes lessons (with their evidence) and
judges the lessons it was shown. Reading never creates the memory file; only after_run does. Unverified attempts
never reach memory: tunings come from `correct` attempts only, lessons are prose with code stripped.
"""
from __future__ import annotations

from pathlib import Path

from agent.policy import AttemptView, RunDigest
from tools.records.memory import CPU, MemoryFileError, open_memory, size_bucket
from tools.records.store import Attempt, fastest_key, offline_marker

LESSONS_K = 5


def default_memory(db: Path) -> Path:
    """The memory file beside a run database: runs/memory.db for the default runs/kloop.db."""
    return Path(db).parent / "memory.db"


def target_features(target, gpu: dict | None) -> dict:
    """What memory is keyed and searched by: op, description, input dtypes and size bucket (at the shape this
    machine runs: the CPU size without a GPU), GPU name or 'cpu-interpreter'; and the row length (the innermost
    size of the largest input), which remembered row tiles are scaled by."""
    dtypes, elements, row = [], None, None
    try:
        import torch

        shape = target.shapes(small=gpu is None)[0]
        with torch.device("meta"):
            inputs = target.module_for(shape).get_inputs()
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        dtypes = [str(t.dtype).removeprefix("torch.") for t in tensors]
        elements = sum(t.numel() for t in tensors) or None
        largest = max(tensors, key=lambda t: t.numel(), default=None)
        row = int(largest.shape[-1]) if largest is not None and largest.dim() else None
    except Exception:  # a target whose inputs cannot be made on the meta device: no size bucket
        pass
    bucket, log2 = size_bucket(dtypes, elements)
    return {"op": target.name, "description": target.description, "dtypes": "+".join(sorted(set(dtypes))),
            "bucket": bucket, "size_log2": log2, "gpu": (gpu or {}).get("name") or CPU, "row": row}


def template_names(target, settings: dict) -> list[str]:
    """The offline policy's template names for this target (as agent.policies.offline names them)."""
    if settings.get("seed_kernel"):
        return [Path(settings["seed_kernel"]).stem]
    if getattr(target, "builtin", False):
        from agent.kernels import catalog
        return [s.name for s in catalog.starters_for(target.name)]
    return [f"inductor/{target.name}"]   # agent.policies.offline.inductor_template


def prepare(settings: dict, target, policy: str, gpu: dict | None) -> dict:
    """Run settings to add before the policy is made: memory_seeds (offline) or memory_lessons (model policies)."""
    path = settings.get("memory")
    if not path or not Path(path).exists():
        return {}
    features = target_features(target, gpu)
    try:
        memory = open_memory(path, create=False)
    except MemoryFileError:
        return {}
    try:
        if policy == "offline":
            seeds = memory.seeds(template_names(target, settings), features["size_log2"], features["dtypes"],
                                 features["gpu"])
            return {"memory_seeds": [{**seed, "to_row_length": features["row"]} for seed in seeds]} if seeds else {}
        if policy in ("anthropic", "openai"):
            words = [features["op"], *features["op"].replace("-", "_").split("_"), *features["dtypes"].split("+"),
                     *(features["description"] or "").split(), *features["gpu"].split()]
            lessons = [{k: lesson[k] for k in ("id", "text", "support", "contradict")}
                       for lesson in memory.retrieve(words, LESSONS_K)]
            return {"memory_lessons": lessons} if lessons else {}
        return {}
    finally:
        memory.close()


def after_run(store, run_id: str, policy, settings: dict, target=None) -> list[str]:
    """Keep what the run taught; returns one line per thing kept, for the user. Each run is distilled once per
    number of attempts (a resumed run that added attempts is distilled again)."""
    path = settings.get("memory")
    if not path:
        return []
    run, attempts = store.get_run(run_id), store.attempts(run_id)
    run_key = f"{Path(store.path).resolve()}#{run_id}"
    memory = open_memory(path)
    try:
        if memory.distilled(run_key) >= len(attempts):
            return []
        gpu = run.get("gpu") or None
        features = target_features(target, gpu) if target is not None else \
            {"op": run["target_name"], "description": "", "dtypes": "", "bucket": "? 2^?", "size_log2": None,
             "gpu": (gpu or {}).get("name") or CPU}
        lines = remember_tunings(memory, store, run, attempts, features)
        distill = getattr(policy, "distill", None)
        if distill is not None:
            lines += remember_lessons(memory, store, run, attempts, features, distill, settings)
        memory.mark_distilled(run_key, len(attempts))
        return lines
    finally:
        memory.close()


def remember_tunings(memory, store, run: dict, attempts: list[Attempt], features: dict) -> list[str]:
    """Per offline template, the tunables of its fastest verified attempt (tools.records.store.fastest_key: untimed, the
    first verified)."""

    fastest: dict[str, Attempt] = {}
    for a in attempts:
        marker = offline_marker(a.source or "")
        if a.verdict != "correct" or not marker or marker.get("ptx_edit") or not marker.get("template"):
            continue
        if marker["template"] not in fastest or fastest_key(a) < fastest_key(fastest[marker["template"]]):
            fastest[marker["template"]] = a
    lines = []
    for template, a in fastest.items():
        values = offline_marker(a.source)["values"]
        executed_on = a.result.executed_on
        gpu = features["gpu"] if executed_on == "cuda" else CPU
        kept = memory.remember_tuning(template, features["bucket"], features["size_log2"], features["dtypes"], gpu,
                                      values, a.speedup_eager, target_name=run["target_name"], run_id=run["id"],
                                      attempt_id=a.id, run_db=str(store.path), row_length=features.get("row"))
        if kept:
            lines.append(f"memory: tunables of {template} for {features['bucket']} on {gpu} "
                         f"(attempt {a.number})")
    return lines


def remember_lessons(memory, store, run: dict, attempts: list[Attempt], features: dict, distill,
                     settings: dict) -> list[str]:
    views = [AttemptView.of(a) for a in attempts]
    best = next((v for v in views if v.id == run.get("best_attempt_id")), None)
    shown = list(settings.get("memory_lessons") or [])
    lessons, judgements, messages = distill(RunDigest(run["target_name"], features, views, best, shown))
    with store.transaction():  # the extra call's traffic and cost belong to the run, attached to no attempt
        for message in messages:
            store.add_message(run["id"], message)
    by_number = {a.number: a for a in attempts}
    tags = " ".join(str(features[k]) for k in ("op", "description", "dtypes", "bucket", "gpu") if features.get(k))
    lines = []
    for lesson in lessons:
        evidence = [{"attempt_id": by_number[n].id, "number": n, "verdict": by_number[n].verdict,
                     "speedup_eager": by_number[n].speedup_eager} for n in lesson["evidence"] if n in by_number]
        if not evidence:  # a lesson must cite this run's attempts
            continue
        number = memory.add_lesson(lesson["text"], tags, target_name=run["target_name"], gpu=features["gpu"],
                                   run_id=run["id"], run_db=str(store.path), evidence=evidence)
        if number is not None:
            lines.append(f"memory: lesson L{number}")
    shown_ids = {lesson["id"] for lesson in shown}
    for judgement in judgements:
        if judgement["id"] in shown_ids:
            state = memory.judge(judgement["id"], judgement["verdict"], run_id=run["id"], run_db=str(store.path),
                                 why=judgement["why"])
            if state is not None:
                lines.append(f"memory: lesson L{state['id']} {judgement['verdict']} "
                             f"({state['support']}/{state['contradict']}, {state['status']})")
    return lines
