"""A warm, jailed Python for one candidate: torch and triton imported ahead of time, the role chosen later.

sandbox/pool.py keeps a few started; an evaluation takes one as its planner (it will run the candidate's Python)
and, without a GPU, another as its interpreter executor (it will run the candidate's kernel bodies). A process
serves one role for one candidate and is then killed.

    argv: REPLY_FD WORKDIR;  first command: {"cmd": "become", "role": "planner" | "executor"}
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import triton  # noqa: F401  (imported while warm, so a candidate's first import costs nothing)

# Both roles' code too (nothing runs at import): `become` then costs a dict lookup, not an import on the clock.
import sandbox.executor  # noqa: F401,E402
import sandbox.planner  # noqa: F401,E402

from tools.inputs import DEVICE
from tools.numerics import pin_numeric_flags


def main() -> None:
    pin_numeric_flags()
    reply = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    workdir = Path(sys.argv[2])
    if DEVICE.type == "cuda":
        torch.zeros(1, device=DEVICE)  # create the context while warm
    reply.write(json.dumps({"status": "ready"}) + "\n")
    line = sys.stdin.readline()
    role = json.loads(line).get("role") if line else None
    if role == "planner":
        from sandbox.planner import serve
    elif role == "executor":
        from sandbox.executor import serve
    else:
        os._exit(2)
    reply.write(json.dumps({"status": "ok"}) + "\n")
    serve(reply, workdir)
    reply.close()
    os._exit(0)


if __name__ == "__main__":
    main()
