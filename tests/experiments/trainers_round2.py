"""kloop's exports through the trainers themselves, on the committed run databases (issue 37), CPU only, no network.

    python tests/experiments/trainers_round2.py --out results/trainers-round2 --db-dir /tmp/dbs [--kernelbench DIR]

Not a test (minutes on 2 cores). --db-dir gets the committed databases (results/**/*.db.xz) unpacked. Each
step writes its numbers into OUT/trainers_round2.json:
  exports     every format x --train-on x --all-verdicts on the bench, KernelBench level-1 and level-2 databases:
              rows, max_length, warnings, and that every trained / weighted / label-true turn is a `correct`
              attempt's kernel byte for byte (the offline policy's header line aside) and every label-false one is not
  tokens      a byte-level BPE trained here on the exports' text, with TRL's Qwen2.5 chat template: exact counts
              (--tokenizer) against the 2.5-characters-per-token estimate; OpenAI lines over 65,536 tokens
  openai      OpenAI's fine-tuning format rules on every openai file (roles, weights, tool-call arguments as JSON
              strings, tool answers' ids, at least 10 lines, the token limit)
  sft         TRL SFTTrainer, assistant_only_loss=True, a random 1-layer Qwen2 model: the trained tokens of every row
              are its verified submission through the end-of-turn token, never the context; a few steps
  kto         TRL KTOTrainer on `label` (trl --all-verdicts), a few steps
  grpo        TRL GRPOTrainer with agent.reward.trl_reward, a few steps; then the verified completions as the Qwen2.5
              template writes them (`<tool_call>` text), scored by the CPU evaluator against their structured calls
  verl        agent.reward.compute_score as verl calls it, on verl rows: a verified response and garbage
  decontam    --exclude with every KernelBench release given (--kernelbench: folders holding KernelBench/level1..2)
  groups      rl group_id by prompt and by target: groups with more than one distinct reward
"""
from __future__ import annotations

import argparse
import copy
import json
import lzma
import re
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent.prompting import export_prompts  # noqa: E402
from tools.records.export import ExportOptions, export, without_offline_mark  # noqa: E402

SUITES = {"bench": ["bench-h200-part1.db.xz", "bench-h200-part2.db.xz"],
          "level1": ["suite-kernelbench-h100x4/level1/suite.db.xz"],
          "level2": ["suite-kernelbench-h100x4/level2/suite.db.xz"]}
CHAT_FORMATS = ("trl", "openai", "rl", "verl")


def unpack(db_dir: Path) -> dict[str, list[Path]]:
    """The committed databases, unpacked once into db_dir."""
    db_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for suite, names in SUITES.items():
        out[suite] = []
        for name in names:
            source = ROOT / "results" / name
            target = db_dir / name.replace("/", "_").removesuffix(".xz")
            if not target.exists():
                with lzma.open(source) as f, open(target, "wb") as g:
                    shutil.copyfileobj(f, g)
            out[suite].append(target)
    return out


def attempts_of(dbs: list[Path]) -> dict[tuple[str, int], tuple[str, str]]:
    found = {}
    for db in dbs:
        with sqlite3.connect(db) as conn:
            found.update({(r, n): (s or "", v) for r, n, s, v in conn.execute(
                "SELECT run_id, number, source, verdict FROM attempts")})
    return found


def submitted(message: dict) -> str | None:
    for call in message.get("tool_calls") or []:
        if call["function"]["name"] == "submit_candidate":
            args = call["function"]["arguments"]
            return (json.loads(args) if isinstance(args, str) else args)["source"]
    match = re.search(r"```python\n# language: \w+\n(.*)\n```", message.get("content") or "", re.S)
    return match.group(1) + "\n" if match else None


def units(fmt: str, out: Path) -> list[tuple[str, int, str | None, bool]]:
    """(run, attempt number, kernel as written, weighted) of every submission in an export."""
    if fmt == "verl":
        import pyarrow.parquet as pq
        rows = pq.read_table(out).to_pylist()
        return [(json.loads(r["extra_info"]["provenance"])["run_id"],
                 json.loads(r["extra_info"]["provenance"])["attempt_number"],
                 submitted({"content": r["extra_info"]["response"]}), r["extra_info"]["label"]) for r in rows]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    if fmt == "openai":
        sidecar = [json.loads(line) for line in out.with_name(out.name + ".provenance.jsonl").read_text().splitlines()]
        found = []
        for line, side in zip(lines, sidecar):
            weighted = [m for m in line["messages"] if m.get("weight") == 1]
            found += [(side["provenance"]["run_id"], n, submitted(m), True)
                      for n, m in zip(side["trained_attempts"], weighted)]
        return found
    if fmt == "kernelbook":
        return [(r["provenance"]["run_id"], r["provenance"]["attempt_number"], r["triton_code"] or r["ptx_code"],
                 r["label"]) for r in lines]
    return [(r["provenance"]["run_id"], r["provenance"]["attempt_number"], submitted(r["completion"][0]), r["label"])
            for r in lines]


def check_weighted(fmt: str, out: Path, attempts: dict) -> dict:
    """Every weighted unit a correct attempt byte for byte; every unweighted one a failed attempt."""
    found = units(fmt, out)
    bad = []
    for run, number, source, weighted in found:
        logged, verdict = attempts[(run, number)]
        if weighted != (verdict == "correct") or (source is not None and source != without_offline_mark(logged)):
            bad.append((run, number, verdict, weighted))
    return {"units": len(found), "weighted": sum(w for *_, w in found), "violations": len(bad), "examples": bad[:3]}


def run_export(dbs, out: Path, **kw) -> dict:
    options = ExportOptions(prompts=export_prompts(), **kw)
    t = time.time()
    summary = export(dbs, out, options)
    return {"rows": summary.written, "max_length": summary.max_length, "max_prompt": summary.max_prompt,
            "max_trained": summary.max_trained, "counted_by": summary.counted_by, "warnings": summary.warnings,
            "groups": summary.groups, "duplicates": summary.duplicates, "seconds": round(time.time() - t, 1)}


# -- steps -----------------------------------------------------------------------------------------------------------

def step_exports(dbs: dict, work: Path, report: dict) -> None:
    report["exports"] = {}
    for suite, paths in dbs.items():
        attempts = attempts_of(paths)
        for fmt in ("trl", "openai", "rl", "verl", "kernelbook"):
            for train_on in ("final", "all-correct"):
                for all_verdicts in (False, True):
                    if fmt in ("rl", "verl") and (train_on, all_verdicts) != ("final", False):
                        continue   # rl/verl hold every verdict whatever the flags
                    name = f"{suite}.{fmt}.{train_on}{'.all-verdicts' if all_verdicts else ''}"
                    out = work / suite / f"{name}.{'parquet' if fmt == 'verl' else 'jsonl'}"
                    out.parent.mkdir(parents=True, exist_ok=True)
                    entry = run_export(paths, out, format=fmt, train_on=train_on, all_verdicts=all_verdicts)
                    entry["check"] = check_weighted(fmt, out, attempts)
                    report["exports"][name] = entry
                    print(name, entry["rows"], entry["max_length"], entry["check"]["violations"], flush=True)


def build_tokenizer(work: Path) -> Path:
    """A byte-level BPE trained on the exports' text, Qwen2.5's special tokens and TRL's Qwen2.5 chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen2_5_chat_template

    texts = [line for p in work.rglob("*.trl.*.jsonl") for line in p.read_text().splitlines()]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=8192, special_tokens=special,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": special})
    tokenizer.chat_template = qwen2_5_chat_template
    path = work / "tokenizer"
    tokenizer.save_pretrained(path)
    return path


def step_tokens(dbs: dict, work: Path, tokenizer: Path, report: dict) -> None:
    """Exact counts through the tokenizer's chat template against the estimate, on the same rows."""
    from tools.records.export import TokenCounter, _build, length_stats
    report["tokens"] = {}
    for suite, paths in dbs.items():
        for fmt, train_on in (("trl", "final"), ("trl", "all-correct"), ("openai", "all-correct"), ("verl", "final")):
            name = f"{suite}.{fmt}.{train_on}"
            rows = _build(paths, ExportOptions(format=fmt, train_on=train_on, prompts=export_prompts(),
                                               tokenizer=str(tokenizer))).rows
            exact = [row["tokens"] for row in rows]
            _, *estimate = length_stats(rows, TokenCounter(None))
            guessed = [row["tokens"] for row in rows]
            per_row = [(r["prompt"] + r["trained"]) / max(sum(t), 1) for r, t in zip(rows, exact)]
            report["tokens"][name] = {
                "rows": len(rows),
                "exact": {"max_length": max(map(sum, exact)), "max_prompt": max(t[0] for t in exact),
                          "max_trained": max(t[1] for t in exact)},
                "estimate": dict(zip(("max_length", "max_prompt", "max_trained"), estimate)),
                "rows_the_estimate_counts_short": sum(g[0] < e[0] or g[1] < e[1] for g, e in zip(guessed, exact)),
                "chars_per_token_per_row": {"min": round(min(per_row), 2),
                                            "median": round(sorted(per_row)[len(per_row) // 2], 2)},
                "rows_over_65536": sum(sum(t) > 65_536 for t in exact),
                "prompts_within_verl_default_1024": sum(t[0] <= 1024 for t in exact)}
            print(name, report["tokens"][name], flush=True)


def step_openai(work: Path, tokenizer: Path, report: dict) -> None:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    report["openai"] = {}
    for path in sorted(p for suite in SUITES for p in (work / suite).glob("*.openai.*.jsonl")):
        if path.name.endswith(".provenance.jsonl"):
            continue
        problems, over, lines = [], 0, path.read_text().splitlines()
        for i, text in enumerate(lines):
            line = json.loads(text)
            if set(line) - {"messages", "tools", "parallel_tool_calls"}:
                problems.append(f"line {i}: keys {sorted(line)}")
            calls = set()
            for m in line["messages"]:
                if m["role"] not in ("system", "user", "assistant", "tool"):
                    problems.append(f"line {i}: role {m['role']}")
                if ("weight" in m) != (m["role"] == "assistant") or m.get("weight", 0) not in (0, 1):
                    problems.append(f"line {i}: weight on {m['role']}")
                for c in m.get("tool_calls") or []:
                    calls.add(c["id"])
                    if not isinstance(c["function"]["arguments"], str):
                        problems.append(f"line {i}: arguments not a string")
                    json.loads(c["function"]["arguments"])
                if m.get("tool_calls") and m.get("content", None) == "":
                    problems.append(f"line {i}: empty content beside tool calls")
                if m["role"] == "tool" and m.get("tool_call_id") not in calls:
                    problems.append(f"line {i}: tool answer without its call")
            if not any(m.get("weight") == 1 for m in line["messages"]):
                problems.append(f"line {i}: nothing to train")
            rendered = tok.apply_chat_template([dict(m, tool_calls=[dict(c, function=dict(
                c["function"], arguments=json.loads(c["function"]["arguments"]))) for c in m["tool_calls"]])
                if m.get("tool_calls") else m for m in line["messages"]], tools=line.get("tools"))["input_ids"]
            over += len(rendered) > 65_536
        report["openai"][path.name] = {"lines": len(lines), "at_least_10": len(lines) >= 10,
                                       "problems": len(problems), "examples": problems[:3],
                                       "over_65536_tokens": over}
        print(path.name, report["openai"][path.name], flush=True)


def tiny_model(tokenizer, positions: int):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                        max_position_embeddings=positions, tie_word_embeddings=True))


def load_rows(path: Path, keep: tuple[str, ...]):
    import datasets
    rows = datasets.load_dataset("json", data_files=str(path), split="train")
    return rows, rows.remove_columns([c for c in rows.column_names if c not in keep])


def step_sft(work: Path, tokenizer: Path, report: dict, steps: int) -> None:
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer
    tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    path = work / "bench" / "bench.trl.final.jsonl"
    rows, dataset = load_rows(path, ("prompt", "completion", "tools"))
    max_length = report["tokens"]["bench.trl.final"]["exact"]["max_length"]
    args = SFTConfig(output_dir=str(work / "sft"), max_steps=steps, per_device_train_batch_size=1,
                     max_length=max_length, report_to=[], save_strategy="no", use_cpu=True,
                     assistant_only_loss=True, logging_steps=1)
    t = time.time()
    trainer = SFTTrainer(model=tiny_model(tok, max_length + 64), args=args, train_dataset=dataset,
                         processing_class=tok)
    whole, clean = 0, 0
    for example, row in zip(trainer.train_dataset, rows):
        mask = example.get("assistant_masks") or example.get("completion_mask")
        trained = tok.decode([t for t, m in zip(example["input_ids"], mask) if m] if mask is not None else
                             [t for t, label in zip(example["input_ids"], example["labels"]) if label != -100])
        source = submitted(row["completion"][0]) or ""
        whole += trained.rstrip().endswith("<|im_end|>") and json.dumps(source)[-60:-1] in trained
        clean += "# kloop-offline" not in trained and "# Target" not in trained and \
            trained.count(row["completion"][0]["tool_calls"][0]["function"]["arguments"]["rationale"][:40]) <= 1
    kept = len(trainer.train_dataset)
    # the steps on the two shortest rows: a 22k-token row is minutes a step on 2 shared cores
    shortest = sorted(range(kept), key=lambda i: len(trainer.train_dataset[i]["input_ids"]))[:2]
    trainer.train_dataset = trainer.train_dataset.select(shortest)
    trainer.train()
    report["sft"] = {"rows": len(rows), "kept": kept, "max_length": max_length, "stepped_on_rows": shortest,
                     "trained_through_end_of_turn": whole, "no_context_header_or_second_rationale": clean,
                     "steps": trainer.state.global_step,
                     "loss": [h["loss"] for h in trainer.state.log_history if "loss" in h],
                     "seconds": round(time.time() - t, 1)}
    print("sft", report["sft"], flush=True)


def step_kto(work: Path, tokenizer: Path, report: dict, steps: int) -> None:
    from transformers import AutoTokenizer
    from trl import KTOConfig, KTOTrainer
    tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    path = work / "level2" / "level2.trl.final.all-verdicts.jsonl"
    rows, dataset = load_rows(path, ("prompt", "completion", "label"))
    lengths = [len(json.dumps(r["prompt"])) + len(json.dumps(r["completion"])) for r in rows]
    # the shortest rows of each label, so a few CPU steps see both
    pick = sorted(range(len(rows)), key=lengths.__getitem__)
    chosen = [i for i in pick if rows[i]["label"]][:2] + [i for i in pick if not rows[i]["label"]][:2]
    dataset = dataset.select(chosen)
    max_length = max(lengths[i] for i in chosen) // 2 + 256   # BPE here does more than 2 characters per token
    args = KTOConfig(output_dir=str(work / "kto"), max_steps=steps, per_device_train_batch_size=2,
                     max_length=max_length, report_to=[], save_strategy="no", use_cpu=True, logging_steps=1)
    model = tiny_model(tok, max_length + 64)
    t = time.time()
    trainer = KTOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=dataset,
                         processing_class=tok)
    trainer.train()
    report["kto"] = {"rows": len(rows), "labels": {"true": sum(rows["label"]), "false": len(rows) - sum(rows["label"])},
                     "trained_on": len(chosen), "steps": trainer.state.global_step,
                     "loss": [h["loss"] for h in trainer.state.log_history if "loss" in h],
                     "seconds": round(time.time() - t, 1)}
    print("kto", report["kto"], flush=True)


def template_text(tok, message: dict) -> str:
    """The assistant turn as the chat template writes it: what a generating model emits and GRPO passes on."""
    head = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
    whole = tok.apply_chat_template([{"role": "user", "content": "x"}, message], tokenize=False)
    return whole[len(head):].removesuffix("\n").removesuffix("<|im_end|>")


def step_grpo(work: Path, tokenizer: Path, report: dict, steps: int, evaluations: int) -> None:
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from agent import reward
    tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    rows, dataset = load_rows(work / "bench" / "bench.rl.final.jsonl", ("prompt", "reference_source"))
    seen = []

    def kloop_reward(prompts=None, completions=None, reference_source=None, **kwargs):
        scores = reward.trl_reward(prompts=prompts, completions=completions, reference_source=reference_source)
        seen.append(scores)
        return scores

    shortest = sorted(range(len(rows)), key=lambda i: len(json.dumps(rows[i]["prompt"])))[:2]
    longest_prompt = max(len(tok.apply_chat_template(rows[i]["prompt"], add_generation_prompt=True)["input_ids"])
                         for i in shortest)
    args = GRPOConfig(output_dir=str(work / "grpo"), max_steps=steps, per_device_train_batch_size=2,
                      num_generations=2, max_completion_length=24, report_to=[], save_strategy="no", use_cpu=True,
                      logging_steps=1)
    t = time.time()
    trainer = GRPOTrainer(model=tiny_model(tok, longest_prompt + 128), reward_funcs=[kloop_reward], args=args,
                          train_dataset=dataset.select(shortest), processing_class=tok)
    trainer.train()
    report["grpo"] = {"steps": trainer.state.global_step, "rewards_seen": seen, "seconds": round(time.time() - t, 1)}
    # the template's own tool-call text, scored against the same call given as structured tool_calls
    from sandbox.evaluate import Session
    # one verified Triton kernel per small target (a PTX kernel cannot run on the CPU: runtime_error, 0.1)
    verified = [next(r for r in rows if r["label"] and r["target_name"] == name and r["language"] == "triton")
                for name in ("vector_add", "gelu", "row_sum", "softmax")][:evaluations]
    scored = []
    with Session(spares=0) as session:
        for row in verified:
            message = row["completion"][0]
            text = template_text(tok, message)
            t0 = time.time()
            as_text = reward.score(text, row["reference_source"], session=session)
            t1 = time.time()
            structured = reward.score([message], row["reference_source"], session=session)
            scored.append({"target": row["target_name"], "text_starts": text[:40], "text": as_text.reward,
                           "structured": structured.reward, "verdict": as_text.verdict, "device": as_text.device,
                           "seconds": round(t1 - t0, 1)})
            print("grpo template text", scored[-1], flush=True)
    report["grpo"]["template_text_vs_structured"] = scored
    print("grpo", {k: v for k, v in report["grpo"].items() if k != "rewards_seen"}, flush=True)


def step_verl(work: Path, report: dict, evaluations: int) -> None:
    import pyarrow.parquet as pq

    from agent import reward
    rows = pq.read_table(work / "bench" / "bench.verl.final.parquet").to_pylist()
    verified = [r for r in rows if r["extra_info"]["label"] and r["extra_info"]["language"] == "triton" and
                r["data_source"] in ("kloop/vector_add", "kloop/gelu", "kloop/row_sum")][:evaluations]
    scores = []
    for row in verified:
        t = time.time()
        score = reward.compute_score(row["data_source"], row["extra_info"]["response"],
                                     row["reward_model"]["ground_truth"], row["extra_info"])
        scores.append({"data_source": row["data_source"], "verified": score, "seconds": round(time.time() - t, 1),
                       "garbage": reward.compute_score(row["data_source"], "I could not write it.",
                                                       row["reward_model"]["ground_truth"], row["extra_info"])})
        print("verl", scores[-1], flush=True)
    prompts = [r["prompt"] for r in rows]
    report["verl"] = {"rows": len(rows), "scores": scores, "prompt_messages_roles": sorted(
        {m["role"] for p in prompts for m in p})}


def step_decontam(dbs: dict, kernelbench: list[Path], report: dict) -> None:
    from tools.records.decontaminate import load_problems, match, problem
    report["decontam"] = {}
    for release in kernelbench:
        for level in ("level1", "level2"):
            problems = load_problems([release / "KernelBench" / level])
            runs = []
            for db in dbs[level]:
                with sqlite3.connect(db) as conn:
                    runs += [problem(s, n) for n, s in conn.execute("SELECT target_name, target_source FROM runs")]
            hits = [(r.name, match(r, problems)) for r in runs]
            names = {Path(p.name).stem for p in problems}
            held = [n for n, _ in hits if n in names]
            report["decontam"][f"{release.name}/{level}"] = {
                "runs": len(runs), "excluded": sum(m is not None for _, m in hits),
                "runs_of_a_problem_it_holds": len(held),
                "of_those_excluded": sum(m is not None for n, m in hits if n in names),
                "by": {why: sum(1 for _, m in hits if m and m[1].split(" (")[0] == why)
                       for why in sorted({m[1].split(" (")[0] for _, m in hits if m})},
                "not_excluded": [n for n, m in hits if m is None]}
            print(release.name, level, report["decontam"][f"{release.name}/{level}"], flush=True)


def step_split(dbs: dict, work: Path, report: dict) -> None:
    out = work / "split" / "rl.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    entry = run_export(dbs["bench"] + dbs["level1"], out, format="rl", split_by="target", test_fraction=0.2)
    sides = {}
    for side in ("train", "test"):
        for line in out.with_name(f"rl.{side}.jsonl").read_text().splitlines():
            sides.setdefault(json.loads(line)["target_name"], set()).add(side)
    report["split"] = {"softmax": sorted(sides.get("softmax", [])), "23_Softmax": sorted(sides.get("23_Softmax", [])),
                       "targets_on_both_sides": sum(len(s) > 1 for s in sides.values()), "export": entry}
    print("split", report["split"], flush=True)


def step_groups(dbs: dict, work: Path, report: dict) -> None:
    report["groups"] = {}
    for suite, paths in dbs.items():
        for by in ("prompt", "target"):
            out = work / "groups" / f"{suite}.{by}.jsonl"
            out.parent.mkdir(parents=True, exist_ok=True)
            report["groups"][f"{suite}/{by}"] = run_export(paths, out, format="rl", group_by=by)["groups"]
    print("groups", report["groups"], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--db-dir", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=None, help="where exports go (default: a temp folder)")
    parser.add_argument("--kernelbench", type=Path, nargs="*", default=[])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--evaluations", type=int, default=4, help="CPU evaluations per reward check")
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="kloop-trainers-"))
    args.out.mkdir(parents=True, exist_ok=True)
    report_path = args.out / "trainers_round2.json"
    report = json.loads(report_path.read_text()) if report_path.exists() and args.only else {}
    dbs = unpack(args.db_dir)
    tokenizer = work / "tokenizer"
    steps = {"exports": lambda: step_exports(dbs, work, report),
             "tokenizer": lambda: build_tokenizer(work),
             "tokens": lambda: step_tokens(dbs, work, tokenizer, report),
             "openai": lambda: step_openai(work, tokenizer, report),
             "groups": lambda: step_groups(dbs, work, report),
             "split": lambda: step_split(dbs, work, report),
             "decontam": lambda: step_decontam(dbs, args.kernelbench, report),
             "sft": lambda: step_sft(work, tokenizer, report, args.steps),
             "kto": lambda: step_kto(work, tokenizer, report, args.steps),
             "grpo": lambda: step_grpo(work, tokenizer, report, args.steps, args.evaluations),
             "verl": lambda: step_verl(work, report, args.evaluations)}
    for name, step in steps.items():
        if args.only is None or name in args.only:
            t = time.time()
            step()
            report.setdefault("seconds", {})[name] = round(time.time() - t, 1)
            report_path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"wrote {report_path}; exports in {work}")


if __name__ == "__main__":
    main()
