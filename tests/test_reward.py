"""agent.reward and the serve client's reward functions read every tool-call text a trainer may hand them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent import reward, serve_client
from tools.result import EvalResult

HERE = Path(__file__).parent
REFERENCE = (HERE / "targets" / "tiny_add.py").read_text()
HONEST = (HERE / "candidates" / "honest_add.py").read_text()
ARGUMENTS = {"language": "triton", "source": HONEST, "rationale": "one program per block"}
STRUCTURED = [{"role": "assistant", "content": "", "tool_calls": [
    {"type": "function", "function": {"name": "submit_candidate", "arguments": ARGUMENTS}}]}]
CALL = json.dumps({"name": "submit_candidate", "arguments": ARGUMENTS})

# How chat templates write the same call into text (the completion a GRPO trainer passes to a reward function)
TEXTS = {
    "qwen-hermes": f"I will submit.\n<tool_call>\n{CALL}\n</tool_call>",
    "llama3": "<|python_tag|>" + json.dumps({"name": "submit_candidate", "parameters": ARGUMENTS}),
    "llama3-bare": json.dumps({"name": "submit_candidate", "parameters": ARGUMENTS}) + "<|eot_id|>",
    "mistral": "[TOOL_CALLS]" + json.dumps([{"name": "submit_candidate", "arguments": ARGUMENTS, "id": "a1b2c3d4e"}]),
    "mistral-v11": "[TOOL_CALLS]submit_candidate[ARGS]" + json.dumps(ARGUMENTS) + "</s>",
    "plain-json-call": CALL,
    "openai-json": json.dumps({"type": "function", "function": {"name": "submit_candidate",
                                                                 "arguments": json.dumps(ARGUMENTS)}}),
    "arguments-only": "```json\n" + json.dumps(ARGUMENTS, indent=2) + "\n```",
    "raw-newlines": CALL.replace("\\n", "\n"),   # a model that writes the source's newlines unescaped
    "fenced-python": f"one program per block\n```python\n{HONEST}```",
    "message-content": [{"role": "assistant", "content": f"<tool_call>{CALL}</tool_call>"}],
}


def fake_evaluate(target, source, settings, session):
    """The evaluator seam score() calls: the honest kernel is correct, anything else incorrect (CPU, untimed)."""
    return EvalResult(verdict="correct" if source.strip() == HONEST.strip() else "incorrect",
                      executed_on="cpu-interpreter")


@pytest.mark.parametrize("syntax", sorted(TEXTS))
def test_every_tool_call_syntax_is_the_structured_candidate(syntax):
    expected, _ = reward.candidate_of(STRUCTURED)
    candidate, reason = reward.candidate_of(TEXTS[syntax])
    assert candidate is not None, reason
    assert (candidate.language, candidate.source.strip()) == (expected.language, expected.source.strip())


@pytest.mark.parametrize("syntax", sorted(TEXTS))
def test_every_syntax_scores_as_the_structured_call(syntax, monkeypatch):
    monkeypatch.setattr("sandbox.evaluate.evaluate", fake_evaluate)
    structured = reward.score(STRUCTURED, REFERENCE)
    assert (structured.reward, structured.verdict, structured.device) == (1.0, "correct", "cpu-interpreter")
    assert reward.trl_reward(completions=[TEXTS[syntax]], reference_source=[REFERENCE]) == [1.0]
    assert reward.compute_score("kloop/tiny_add", TEXTS[syntax], REFERENCE, {"language": "triton"}) == 1.0


def test_a_wrong_kernel_in_any_syntax_is_judged_not_skipped(monkeypatch):
    monkeypatch.setattr("sandbox.evaluate.evaluate", fake_evaluate)
    bad = dict(ARGUMENTS, source=HONEST.replace("+", "-"))
    text = "<tool_call>" + json.dumps({"name": "submit_candidate", "arguments": bad}) + "</tool_call>"
    assert (reward.score(text, REFERENCE).verdict, reward.score(text, REFERENCE).reward) == ("incorrect", 0.1)


def test_what_is_not_a_submission():
    # another tool's call is no candidate; the last submit_candidate call wins over a fenced block
    inspect = '<tool_call>{"name": "get_ptx", "arguments": {"attempt": 1}}</tool_call>'
    assert reward.candidate_of(inspect) == (None, "the answer has no ```python block defining ModelNew")
    assert reward.tool_calls_in_text(inspect) == [{"name": "get_ptx", "arguments": {"attempt": 1}}]
    both = f"```python\n{HONEST.replace('+', '-')}```\n<tool_call>{CALL}</tool_call>"
    assert reward.candidate_of(both)[0].source.strip() == HONEST.strip()
    broken = '<tool_call>{"name": "submit_candidate", "arguments": "{not json"}</tool_call>'
    assert reward.candidate_of(broken) == (None, "submit_candidate arguments are not JSON")
    assert reward.candidate_of('{"name": "submit_candidate", "arguments": {"source": ""}}')[0] is None
    assert reward.tool_calls_in_text("x[0] = {1: 2}; y = [1, 2]") == []


@pytest.mark.parametrize("syntax", ["qwen-hermes", "llama3", "mistral", "plain-json-call"])
def test_serve_client_reward_reads_the_same_syntaxes(syntax):
    class Client:
        url = "http://127.0.0.1:1"

        def evaluate(self, target, candidate, options=None):
            return {"reward": 1.0 if candidate.strip() == HONEST.strip() else 0.1}

    assert serve_client.completion_reward(Client(), TEXTS[syntax], "tiny_add", "triton") == 1.0
    assert serve_client.completion_reward(Client(), "no call here", "tiny_add") == 0.0


@pytest.mark.slow
def test_the_evaluator_scores_template_text_as_a_structured_call():
    """The CPU evaluator itself, on the Qwen template's text and on the structured call (one session)."""
    from sandbox.evaluate import Session

    with Session(spares=0) as session:
        text = reward.score(TEXTS["qwen-hermes"], REFERENCE, session=session)
        structured = reward.score(STRUCTURED, REFERENCE, session=session)
    assert (text.verdict, text.reward, text.device) == (structured.verdict, structured.reward, structured.device) == (
        "correct", 1.0, "cpu-interpreter")


def test_one_reward_for_an_evaluation_and_for_its_logged_attempt():
    # export scores a logged attempt, agent.reward and kloop serve score an EvalResult: the same components and reward
    from tools.records.reward import reward_components, scalar_reward
    from tools.records.store import attempt_columns
    from tools.result import Roofline

    timed = EvalResult(verdict="correct", speedup={"eager": 2.0, "compile": 1.25}, roofline=Roofline(sol_fraction=0.5))
    for result in (timed, EvalResult(verdict="timeout"), EvalResult(verdict="compile_error")):
        assert reward_components(attempt_columns(result)) == reward_components(result)
    assert reward_components(timed) == {"verdict": "correct", "compiled": True, "correct": True, "speedup_eager": 2.0,
                                        "speedup_compile": 1.25, "sol_fraction": 0.5}
    assert [scalar_reward(reward_components(r)) for r in (timed, EvalResult(verdict="timeout"),
                                                          EvalResult(verdict="compile_error"))] == [1.5, 0.1, 0.0]


def test_a_structured_completion_is_read_as_the_wire_reads_a_chat_message():
    # content as text blocks, a tool call that is not an object, arguments as JSON text with raw newlines
    arguments = json.dumps(ARGUMENTS).replace("\\n", "\n")
    message = {"role": "assistant", "content": [{"type": "text", "text": "Submitting."}], "tool_calls": [
        "garbage", {"type": "function", "function": {"name": "submit_candidate", "arguments": arguments}}]}
    candidate, reason = reward.candidate_of(message)
    assert candidate is not None and candidate.source.strip() == HONEST.strip(), reason
    double = dict(message, tool_calls=[{"function": {"name": "submit_candidate", "arguments": json.dumps(CALL)}}])
    assert reward.candidate_of(double) == (None, "submit_candidate input is not an object")
