"""Model policies against real HTTP servers on loopback, the prompts they build, inspection tools and replay."""
from __future__ import annotations

import json

import pytest

# The SDKs are required dependencies; a GPU image that lacks them (carried wheels are capped at 64 MiB a call) skips
# these CPU tests rather than failing the collection of its GPU tests.
pytest.importorskip("anthropic")
pytest.importorskip("openai")

from agent import prompting  # noqa: E402
from agent.inspect_tools import TOOLS, openai_tools, run_tool  # noqa: E402
from agent.policies.anthropic import AnthropicPolicy, cost_usd  # noqa: E402
from agent.policies.openai import OpenAIPolicy  # noqa: E402
from agent.policies.replay import ReplayPolicy, candidate_from_response  # noqa: E402
from agent.policy import AttemptView, PolicyError, ProposeContext  # noqa: E402
from fakes import anthropic_server as fa  # noqa: E402
from fakes import openai_server as fo  # noqa: E402
import evaluated  # noqa: E402
from tools.records.export import model_turns  # noqa: E402
from tools.result import Correctness  # noqa: E402
from tools.records.store import Attempt, attempt_columns, open_db  # noqa: E402

TARGET = '''import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return a + b

def get_inputs():
    return [torch.randn(4096), torch.randn(4096)]

def get_init_inputs():
    return []
'''
TRITON = '''import torch
import torch.nn as nn
import triton
import triton.language as tl

@triton.jit
def add_kernel(a, b, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(a + offs, mask=mask) + tl.load(b + offs, mask=mask), mask=mask)

class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 1024),)](a, b, out, a.numel(), BLOCK=1024)
        return out
'''
PTX_MODULE = '''import torch.nn as nn
from tools.launch import PtxKernel

PTX = """
.version 9.0
.target sm_90
.address_size 64
.visible .entry add(.param .u64 a) { ret; }
"""

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = PtxKernel(PTX, "add")
'''
GPU = evaluated.H200
ADD_BYTES = 48_600_000   # at the H200's 4800 GB/s, 10.125 us: 81% of speed-of-light for a 12.5 us kernel


def view(number: int, verdict="correct", source=TRITON, speedup=1.3, diagnosis="memory bound at 81% of peak",
         **result_fields) -> AttemptView:
    """An earlier attempt as the prompts see it: an evaluator result (tests/evaluated.py), stored as the graph
    stores it (tools.records.store.attempt_columns) and read back as the graph reads it (AttemptView.of). Correct
    ones ran 12.5 us at `speedup` over eager, with Nsight Compute counters."""
    timed = verdict == "correct"
    counters = evaluated.counters("add_kernel", dram_pct=88.0, sm_pct=20.0, achieved_occupancy_pct=91.0,
                                  l2_hit_pct=3.0, stalls={"long_scoreboard": 70.0, "wait": 10.0})
    result = evaluated.result(
        verdict, 12.5 if timed else None, eager_us=12.5 * speedup, compile_us=12.5 * speedup / 1.1, gpu=GPU,
        nbytes=ADD_BYTES, flops=67108864, reasons=[] if timed else [f"reason of attempt {number}"],
        ncu=counters if timed else None, resources=evaluated.resources("add_kernel", registers=24) if timed else [],
        **result_fields)
    row = {"id": number, "run_id": "r", "number": number, "branch": 0, "source": source, "diagnosis": diagnosis,
           **attempt_columns(result)}
    return AttemptView.of(Attempt.from_row(row))


def context(history=(), tool_results=(), branch=0, language="auto", gpu=GPU) -> ProposeContext:
    history = list(history)
    best = next((v for v in reversed(history) if v.verdict == "correct"), None)
    return ProposeContext(run_id="run1", branch=branch, turn=len(history) + 1, target_name="vector_add",
                          target_source=TARGET, language=language, gpu=gpu, history=history, best=best,
                          budget_left={"attempts": 10, "cost_usd": 4.5}, tool_results=list(tool_results))


def anthropic_policy(server, **settings) -> AnthropicPolicy:
    settings = {"max_retries": 1, "timeout": 5.0, **settings}
    return AnthropicPolicy(api_key="sk-test", base_url=server.url, **settings)


def submit(source=TRITON, language="triton", rationale="one masked block per program") -> dict:
    return {"language": language, "source": source, "rationale": rationale}


# -- Anthropic -------------------------------------------------------------------------------------------------------
def test_anthropic_inspects_then_submits_in_one_conversation():
    first = fa.message(fa.thinking("look at the PTX first"), fa.text("Checking the loads."),
                       fa.tool_use("get_ptx", {"attempt": 1}, id="toolu_ptx"))
    second = fa.message(fa.thinking("vectorize"), fa.tool_use("submit_candidate", submit()),
                        input_tokens=100, output_tokens=500, cache_write=0, cache_read=4000)
    with fa.ScriptedServer([first, second]) as server:
        policy = anthropic_policy(server)
        proposal = policy.propose(context([view(1)]))
        assert proposal.tool_calls == [{"id": "toolu_ptx", "name": "get_ptx", "input": {"attempt": 1}}]
        assert not proposal.source and not proposal.format_error
        answer = {"tool_use_id": "toolu_ptx", "name": "get_ptx", "content": "ld.global.v4.f32", "is_error": False}
        proposal = policy.propose(context([view(1)], tool_results=[answer]))

    assert (proposal.language, proposal.source, proposal.reasoning) == ("triton", TRITON,
                                                                       "one masked block per program")
    assert [m.role for m in proposal.messages] == ["request", "response"]
    first_request, second_request = server.bodies
    assert server.requests[0]["path"] == "/v1/messages"
    assert server.requests[0]["headers"]["authorization"] == "Bearer sk-test"
    assert first_request["thinking"] == {"type": "adaptive"}
    assert "temperature" not in first_request
    assert {t["name"] for t in first_request["tools"]} == {t["name"] for t in TOOLS}
    # The stable prefix (target) and the newest block carry cache markers.
    prefix = first_request["messages"][0]["content"][0]
    assert prefix["cache_control"] == {"type": "ephemeral"} and "class Model" in prefix["text"]
    assert "NVIDIA H200" in prefix["text"] and "132 SMs" in prefix["text"]
    assert "ModelNew" in first_request["system"] and "PtxKernel" in first_request["system"]
    # The second request continues the conversation: thinking block back unchanged, then the tool result.
    assistant, tool_reply = second_request["messages"][1:]
    assert assistant["content"][0] == {"type": "thinking", "thinking": "look at the PTX first",
                                       "signature": "sig-abc"}
    assert tool_reply["content"][0]["tool_use_id"] == "toolu_ptx"
    assert tool_reply["content"][0]["content"] == "ld.global.v4.f32"
    assert tool_reply["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in assistant["content"][-1]
    # Tokens and dollars: 100 in, 500 out, 4000 cache reads at claude-opus-4-8 prices.
    response = proposal.messages[1]
    assert (response.input_tokens, response.output_tokens, response.cache_read_tokens) == (100, 500, 4000)
    assert response.cost_usd == pytest.approx((100 * 5 + 500 * 25 + 4000 * 0.5) / 1e6)
    assert response.content["content"][1]["name"] == "submit_candidate"


@pytest.mark.parametrize("status, kind", [(429, "rate_limit_error"), (500, "api_error"), (529, "overloaded_error")])
def test_anthropic_retries_transient_errors(status, kind):
    script = [fa.error(status, kind, "try again"), fa.message(fa.tool_use("submit_candidate", submit()))]
    with fa.ScriptedServer(script) as server:
        proposal = anthropic_policy(server, max_retries=1).propose(context())
    assert proposal.source == TRITON
    assert len(server.requests) == 2


def test_anthropic_persistent_errors_become_an_error_message_and_the_run_goes_on():
    script = [fa.error(500, "api_error", "down"), fa.error(500, "api_error", "still down"),
              fa.message(fa.tool_use("submit_candidate", submit()))]
    with fa.ScriptedServer(script) as server:
        policy = anthropic_policy(server, max_retries=1)
        failed = policy.propose(context())
        assert not failed.source and "InternalServerError 500" in failed.format_error
        assert [m.role for m in failed.messages] == ["request", "error"]
        assert policy.propose(context()).source == TRITON


def test_anthropic_timeout_is_an_error_then_the_next_turn_works():
    script = [fa.Reply(delay_s=1.0), fa.message(fa.tool_use("submit_candidate", submit()))]
    with fa.ScriptedServer(script) as server:
        policy = anthropic_policy(server, max_retries=0, timeout=0.2)
        failed = policy.propose(context())
        assert "APITimeoutError" in failed.format_error
        assert failed.messages[-1].role == "error"
        assert policy.propose(context()).source == TRITON


def test_anthropic_malformed_submission_is_a_format_error():
    script = [fa.message(fa.tool_use("submit_candidate", {"language": "triton", "rationale": "forgot it"})),
              fa.message(fa.tool_use("submit_candidate", submit()))]
    with fa.ScriptedServer(script) as server:
        policy = anthropic_policy(server)
        failed = policy.propose(context())
        assert "without a source" in failed.format_error and not failed.tool_calls
        assert policy.propose(context()).source == TRITON
    # A new turn starts a fresh conversation (the graph logs the failure as a rejected attempt in the history).
    assert len(server.bodies[1]["messages"]) == 1


def test_anthropic_answer_without_code_is_a_format_error():
    with fa.ScriptedServer([fa.message(fa.text("I would use vector loads."))]) as server:
        proposal = anthropic_policy(server).propose(context())
    assert "no submit_candidate call" in proposal.format_error
    assert proposal.reasoning == "I would use vector loads."


def test_anthropic_accepts_a_fenced_block_when_it_skips_the_tool():
    answer = f"Here it is.\n```python\n# language: triton\n{TRITON}```\n"
    with fa.ScriptedServer([fa.message(fa.text(answer))]) as server:
        proposal = anthropic_policy(server).propose(context())
    assert proposal.language == "triton" and "add_kernel[" in proposal.source and proposal.reasoning == "Here it is."


def test_anthropic_inspection_rounds_are_bounded():
    script = [fa.message(fa.tool_use("best_kernel", {})), fa.message(fa.tool_use("best_kernel", {}))]
    with fa.ScriptedServer(script) as server:
        policy = anthropic_policy(server, max_tool_rounds=1)
        call = policy.propose(context()).tool_calls[0]
        answer = {"tool_use_id": call["id"], "name": "best_kernel", "content": "none yet", "is_error": True}
        proposal = policy.propose(context(tool_results=[answer]))
    assert "still inspecting" in proposal.format_error
    assert "last inspection round" in server.bodies[1]["messages"][-1]["content"][-1]["text"]


def test_anthropic_rejected_key_is_one_line_policy_error():
    with fa.ScriptedServer([fa.error(401, "authentication_error", "invalid x-api-key")]) as server:
        with pytest.raises(PolicyError, match="rejected the key") as raised:
            anthropic_policy(server).propose(context())
    assert "\n" not in str(raised.value)
    assert len(server.requests) == 1  # a 401 is not retried


def test_anthropic_missing_key_is_policy_error(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(PolicyError, match="ANTHROPIC_API_KEY"):
        AnthropicPolicy()


def test_anthropic_thinking_budget_and_effort_settings():
    with fa.ScriptedServer([fa.message(fa.tool_use("submit_candidate", submit()))]) as server:
        anthropic_policy(server, thinking=4096, effort="high", max_tokens=8000).propose(context())
    body = server.bodies[0]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert body["output_config"] == {"effort": "high"} and body["max_tokens"] == 8000
    with pytest.raises(PolicyError, match="thinking must be"):
        AnthropicPolicy(api_key="k", thinking="lots")
    with pytest.raises(PolicyError, match="must be below max_tokens"):
        AnthropicPolicy(api_key="k", thinking=8000, max_tokens=8000)
    with pytest.raises(PolicyError, match="at least 1024"):
        AnthropicPolicy(api_key="k", thinking=100)


def test_cost_of_an_unknown_model_is_zero():
    assert cost_usd("claude-opus-4-8-20261101", 10**6, 0, 0, 0) == 5.0  # dated ids match by prefix
    assert cost_usd("some-local-model", 10**6, 10**6, 0, 0) == 0.0


# -- OpenAI-compatible -----------------------------------------------------------------------------------------------
def openai_policy(server, **settings) -> OpenAIPolicy:
    settings = {"max_retries": 1, "timeout": 5.0, **settings}
    return OpenAIPolicy("qwen-coder", base_url=server.url + "/v1", **settings)


def test_openai_inspects_then_submits_through_function_calls():
    script = [fo.completion("Let me compare.", [fo.tool_call("diff", {"attempt_a": 1, "attempt_b": 2}, id="c1")]),
              fo.completion(None, [fo.tool_call("submit_candidate", submit())], cached_tokens=600)]
    with fo.ScriptedServer(script) as server:
        policy = openai_policy(server, price=(1.0, 2.0))
        proposal = policy.propose(context([view(1), view(2)]))
        assert proposal.tool_calls == [{"id": "c1", "name": "diff", "input": {"attempt_a": 1, "attempt_b": 2}}]
        answer = {"tool_use_id": "c1", "name": "diff", "content": "--- attempt 1", "is_error": False}
        proposal = policy.propose(context([view(1), view(2)], tool_results=[answer]))
    assert (proposal.language, proposal.source) == ("triton", TRITON)
    first, second = server.bodies
    assert server.requests[0]["path"] == "/v1/chat/completions"
    assert {t["function"]["name"] for t in first["tools"]} == {t["name"] for t in TOOLS}
    assert first["messages"][0]["role"] == "system" and "class Model" in first["messages"][1]["content"]
    assert second["messages"][2]["tool_calls"][0]["id"] == "c1"
    assert second["messages"][3] == {"role": "tool", "tool_call_id": "c1", "content": "--- attempt 1"}
    response = proposal.messages[1]
    assert (response.input_tokens, response.cache_read_tokens, response.output_tokens) == (300, 600, 200)
    assert response.cost_usd == pytest.approx((900 * 1.0 + 200 * 2.0) / 1e6)


def test_openai_falls_back_to_code_blocks_when_the_server_has_no_tools():
    refusal = fo.error(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
    answer = f"Vectorized PTX.\n```python\n# language: ptx\n{PTX_MODULE}```"
    script = [refusal, fo.completion(answer), fo.completion(f"```python\n{PTX_MODULE}```")]
    with fo.ScriptedServer(script) as server:
        policy = openai_policy(server)
        proposal = policy.propose(context())
        assert (proposal.language, proposal.reasoning) == ("ptx", "Vectorized PTX.")
        assert "PtxKernel(PTX" in proposal.source
        assert [m.role for m in proposal.messages] == ["request", "error", "request", "response"]
        assert policy.propose(context()).language == "ptx"  # no marker: told by its content
    assert "tools" in server.bodies[0] and "tools" not in server.bodies[1] and "tools" not in server.bodies[2]
    assert "ONE fenced block" in server.bodies[1]["messages"][0]["content"]


def test_openai_text_mode_answer_without_code_is_a_format_error():
    with fo.ScriptedServer([fo.completion("I am not sure.")]) as server:
        proposal = openai_policy(server, tools=False).propose(context())
    assert "no ```python block defining ModelNew" in proposal.format_error


def test_openai_malformed_calls():
    script = [fo.completion(None, [fo.tool_call("get_sass", "{attempt: 1")]),
              fo.completion(None, [fo.tool_call("submit_candidate", {"language": "cuda", "source": TRITON})])]
    with fo.ScriptedServer(script) as server:
        policy = openai_policy(server)
        call = policy.propose(context([view(1)])).tool_calls[0]
        assert call["input"] == "{attempt: 1"  # passed on as text: run_tool answers with an error
        answer = run_tool(None, "run1", call)
        assert answer["is_error"] and "must be an object" in answer["content"]
        proposal = policy.propose(context([view(1)], tool_results=[answer]))
    assert "'cuda' is not one of triton, ptx" in proposal.format_error


def test_openai_retries_then_reports_errors():
    script = [fo.error(429, "slow down"), fo.completion(None, [fo.tool_call("submit_candidate", submit())]),
              fo.error(503, "busy"), fo.error(503, "busy")]
    with fo.ScriptedServer(script) as server:
        policy = openai_policy(server)
        assert policy.propose(context()).source == TRITON
        failed = policy.propose(context())
    assert "InternalServerError 503" in failed.format_error and failed.messages[-1].role == "error"
    assert len(server.requests) == 4


def test_openai_rejected_key_and_missing_model():
    with fo.ScriptedServer([fo.error(401, "Invalid API key")]) as server:
        with pytest.raises(PolicyError, match="rejected the API key"):
            openai_policy(server).propose(context())
    with pytest.raises(PolicyError, match="needs --model"):
        OpenAIPolicy(base_url="http://127.0.0.1:9/v1")  # as make_policy calls it without --model


# -- prompts ---------------------------------------------------------------------------------------------------------
def test_prompt_carries_the_evidence_of_each_attempt():
    failed = view(1, "compile_error", compile_log="ptxas error: line 12: unknown symbol %r9",
                  stderr="not shown for compile errors")
    wrong = view(2, "incorrect", correctness=Correctness(trials=1, max_abs_err=0.5, max_rel_err=1.0,
                                                         worst={"shape": {"N": 1000}, "index": [999]}))
    throttled = view(3, nvml={"throttled": True, "reasons": ["SwThermal"]}, flags=["throttled"])
    text = prompting.turn_prompt(context([failed, wrong, throttled]), keep_full=3)
    for expected in ("Attempt 1 (triton): compile_error", "ptxas error: line 12: unknown symbol %r9",
                     "max abs error 0.5", "'index': [999]", "median 12.50 us (IQR 12.25-12.75",
                     "1.30x over eager, 1.18x over torch.compile", "81% (memory-bound", "24 registers, 0 spilled words",
                     "occupancy 100%", "throttled during timing (SwThermal)", "DRAM 88%", "achieved occupancy 91%",
                     "top stalls (warps stalled per issued instruction) long_scoreboard 70.00",
                     "diagnosis: memory bound at 81% of peak", "Budget left: 10 attempts, $4.50"):
        assert expected in text, expected
    assert "not shown for compile errors" not in text


def test_prompt_context_is_bounded_for_long_runs():
    history = [view(n, source=TRITON.replace("1024", str(n))) for n in range(1, 41)]
    history[4] = view(5, speedup=9.0, source=TRITON.replace("1024", "BEST"))
    ctx = context(history)
    ctx.best = history[4]
    text = prompting.turn_prompt(ctx, keep_full=2)
    assert text.count("```python") == 3  # the last two in full, and the best kernel's source
    assert "BLOCK=BEST" in text and "BLOCK=40)" in text and "BLOCK=20)" not in text
    assert "- #20 triton correct, 1.30x eager, 12.5 us, 81% of speed of light" in text
    assert len(text) < 12_000


def test_prompt_without_gpu_says_interpreter():
    assert "no GPU: interpreter" in prompting.target_prompt(context(gpu=None))
    assert "Write the first candidate" in prompting.turn_prompt(context())


# -- inspection tools and replay, on a real run database --------------------------------------------------------------
@pytest.fixture
def store(tmp_path):
    db = open_db(tmp_path / "runs.db")
    yield db
    db.close()


def test_run_tool_reads_the_database(store):
    run = store.create_run(target_name="vector_add", policy="anthropic")
    first = store.add_attempt(run, source=TRITON, **attempt_columns(evaluated.result(
        "correct", 11.0, eager_us=16.5, gpu=GPU, ncu=evaluated.counters("add_kernel", dram_pct=90.0),
        ptx={"add_kernel": ".visible .entry add_kernel("})))
    store.add_attempt(run, language="triton", source=TRITON.replace("1024", "2048"), verdict="incorrect")
    store.update_run(run, best_attempt_id=first)  # the loop's doing (agent/graph.py)

    def call(name, **arguments):
        return run_tool(store, run, {"id": "t1", "name": name, "input": arguments})

    assert call("get_ptx", attempt=1) == {"tool_use_id": "t1", "name": "get_ptx", "is_error": False,
                                          "content": "// ===== add_kernel =====\n.visible .entry add_kernel("}
    assert '"dram_pct": 90.0' in call("get_ncu", attempt=1)["content"]
    diff = call("diff", attempt_a=1, attempt_b=2)["content"]
    assert "-        add_kernel[(triton.cdiv(a.numel(), 1024),)]" in diff and "+++ attempt 2" in diff
    best = call("best_kernel")["content"]
    assert best.startswith("attempt 1 (triton): 1.50x over eager, median 11.00 us") and "class ModelNew" in best
    for name, arguments, message in [("get_sass", {"attempt": 1}, "attempt 1 has no SASS"),
                                     ("get_ncu", {"attempt": 2}, "attempt 2 has no Nsight Compute data"),
                                     ("get_ptx", {"attempt": 7}, "this run has no attempt 7"),
                                     ("get_ptx", {}, "missing argument 'attempt'"),
                                     ("get_ptx", {"attempt": "1"}, "must be an attempt number"),
                                     ("diff", {"attempt_a": 1, "b": 2}, "unknown argument(s) b"),
                                     ("rm_rf", {}, "unknown inspection tool 'rm_rf'"),
                                     ("submit_candidate", submit(), "unknown inspection tool")]:
        answer = call(name, **arguments)
        assert answer["is_error"] and message in answer["content"], (name, answer)


def test_tool_schemas_are_shared_by_both_providers():
    assert [t["function"]["parameters"] for t in openai_tools()] == [t["input_schema"] for t in TOOLS]


def _log_turn(store, run, branch, *messages):
    for message in messages:
        store.add_message(run, message, branch=branch)


def test_replay_reproduces_the_logged_candidates_in_order(store):
    # Record a run through the real policies (fake servers), logging their messages as the graph does.
    second_source = TRITON.replace("1024", "4096")
    anthropic_script = [fa.message(fa.tool_use("best_kernel", {})),
                        fa.message(fa.tool_use("submit_candidate", submit())),
                        fa.message(fa.text("no idea")),
                        fa.message(fa.tool_use("submit_candidate", submit(second_source)))]
    run = store.create_run(target_name="vector_add", policy="anthropic", model="claude-opus-4-8")
    with fa.ScriptedServer(anthropic_script) as server:
        policy = anthropic_policy(server)
        calls = policy.propose(context())
        answer = run_tool(store, run, calls.tool_calls[0])
        _log_turn(store, run, 0, *calls.messages)
        for _ in range(3):
            _log_turn(store, run, 0, *policy.propose(context(tool_results=[answer] if _ == 0 else [])).messages)
    with fo.ScriptedServer([fo.completion(f"```python\n{PTX_MODULE}```")]) as server:
        _log_turn(store, run, 1, *openai_policy(server, tools=False).propose(context(branch=1)).messages)

    replay = ReplayPolicy(store, run)
    assert replay.model == "claude-opus-4-8"
    proposals = [replay.propose(context()) for _ in range(3)]
    assert [p.source for p in proposals[:2]] == [TRITON, second_source]
    assert proposals[2].done and not proposals[2].source
    assert replay.propose(context(branch=1)).language == "ptx"
    assert replay.propose(context(branch=1)).done


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_the_live_policy_the_replay_policy_and_export_read_an_answer_alike(provider):
    """One wire module per provider (tools/records/wire/): the candidate the live policy proposed is the one the replay
    policy and export read back from its logged messages, and its text and thinking reach the export whole."""
    if provider == "anthropic":
        server = fa.ScriptedServer([fa.message(fa.thinking("vectorize"), fa.text("One block per program."),
                                               fa.tool_use("submit_candidate", submit(rationale="masked")))])
        make = anthropic_policy
    else:
        server = fo.ScriptedServer([fo.completion("One block per program.",
                                                  [fo.tool_call("submit_candidate", submit(rationale="masked"))])])
        make = openai_policy
    with server:
        proposal = make(server).propose(context([view(1)]))
    assert (proposal.language, proposal.source, proposal.reasoning) == ("triton", TRITON, "masked")
    request, response = [{"role": m.role, "provider": m.provider, "content": json.loads(json.dumps(m.content)),
                          "attempt_id": 7} for m in proposal.messages]
    replayed = candidate_from_response(response["provider"], response["content"])
    assert (replayed.language, replayed.source, replayed.rationale) == ("triton", TRITON, "masked")
    (turn,) = model_turns([Attempt(id=7, run_id="r", number=1)], [request, response])
    assert turn.completion["content"] == "One block per program."
    assert turn.completion.get("reasoning_content") == ("vectorize" if provider == "anthropic" else None)
    (call,) = turn.completion["tool_calls"]
    assert call["function"] == {"name": "submit_candidate", "arguments": submit(rationale="masked")}
    assert turn.prompt[0]["role"] == "system" and "class Model" in turn.prompt[1]["content"]
    assert [t["function"]["name"] for t in turn.tools] == [t["name"] for t in TOOLS]


def test_replay_of_unknown_or_empty_run_is_policy_error(store):
    with pytest.raises(PolicyError, match="no run nope"):
        ReplayPolicy(store, "nope")
    run = store.create_run(target_name="vector_add", policy="offline")
    with pytest.raises(PolicyError, match="no recorded model responses"):
        ReplayPolicy(store, run)


def test_anthropic_stream_broken_midway_is_an_error_message():
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    broken = fa.message(fa.text("Starting"))
    broken.events = broken.events[:2] + [("error", overloaded)]
    with fa.ScriptedServer([broken]) as server:
        proposal = anthropic_policy(server).propose(context())
    assert "Overloaded" in proposal.format_error and proposal.messages[-1].role == "error"
    assert server.bodies[0]["stream"] is True


def test_openai_timeout_is_an_error_then_the_next_turn_works():
    script = [fo.Reply(delay_s=1.0), fo.completion(None, [fo.tool_call("submit_candidate", submit())])]
    with fo.ScriptedServer(script) as server:
        policy = openai_policy(server, max_retries=0, timeout=0.2)
        failed = policy.propose(context())
        assert "APITimeoutError" in failed.format_error and failed.messages[-1].role == "error"
        assert policy.propose(context()).source == TRITON
