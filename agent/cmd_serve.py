"""`kloop serve`: the evaluator as an HTTP service for RL trainers (agent/serve.py)."""
from __future__ import annotations


import typer

from agent.output import fail
from agent.serve import DEFAULT_DB, DEFAULT_PORT  # the module's top imports only the standard library


def serve_command(
    host: str = typer.Option("127.0.0.1", help="Address to listen on. Anything but a loopback address needs --token."),
    port: int = typer.Option(DEFAULT_PORT, min=0, max=65535, help="Port (0: any free one; the first line printed says which)."),
    token: str = typer.Option(None, envvar="KLOOP_SERVE_TOKEN", show_envvar=True,
                              help="Bearer token every request but GET /v1/health must carry."),
    db: str = typer.Option(DEFAULT_DB, help="SQLite file of the queue and the answers (kept across restarts)."),
    workers: int = typer.Option(2, min=1, help="Worker processes on CPU, each with an evaluator session of its own."),
    gpus: str = typer.Option(None, help="all, or GPU indices (0,1,...): one worker per GPU, instead of --workers."),
    queue: int = typer.Option(64, min=1, help="Requests that may wait for a worker; beyond that 429 with Retry-After."),
    time_limit: float = typer.Option(600.0, "--time-limit", min=0.001,
                                     help="Seconds one evaluation may take on a worker (a request may ask for less)."),
    evaluator: str = typer.Option("agent.serve:evaluate_request", hidden=True,
                                  help="MODULE:FUNCTION that evaluates one request in a worker (tests use stubs)."),
) -> None:
    """Serve evaluations over HTTP: POST /v1/evaluate, GET /v1/result/{id}, GET /v1/health."""
    try:
        from agent import serve
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        fail(f"kloop serve needs the serve extra ({e.name} is missing): pip install -e '.[serve]'")
    gpu_list = None
    if gpus is not None:
        gpu_list = _gpus(gpus)
    config = serve.ServiceConfig(db=db, workers=workers, gpus=gpu_list, max_queue=queue, time_limit_s=time_limit,
                                 evaluator=evaluator, token=token or None)
    try:
        serve.serve(host, port, config, announce=lambda line: print(line, flush=True))
    except serve.ServeError as e:
        fail(str(e))


def _gpus(spec: str) -> list[str]:
    """The GPUs' CUDA_VISIBLE_DEVICES entries, one per worker; indices count the GPUs this process sees. Each worker
    judges on its own GPU alone, so GPUs of different kinds may serve side by side."""
    from sandbox.placement import PlacementError, parse_gpus, visible_entries

    try:
        return visible_entries(parse_gpus(spec))
    except PlacementError as e:
        fail(str(e))
