"""How a run's progress reads on a terminal or in a log: the graph's events as lines, attempts in a few words.

`ProgressView` is the `on_event` callback that `kloop optimize`, `resume` and `bench` hand to agent.run.run.
"""
from __future__ import annotations

import re

from rich.console import Console
from rich.markup import escape

from agent.output import duration, plural


class ProgressView:
    """Renders the loop's events: the current stage on a spinner (`status`, set while one is shown), one line per
    attempt, API errors, stops and warnings."""

    def __init__(self, max_attempts: int, console: Console):
        self.max_attempts = max_attempts
        self.console = console
        self.status = None

    def __call__(self, event: dict) -> None:
        lead = f"{escape(event['problem'])} " if event.get("problem") else ""  # a suite's lanes side by side
        print_line = lambda line: self.console.print(lead + line, highlight=False)  # noqa: E731
        if event["kind"] == "stage" and self.status is not None:
            self.status.update(f"{lead}branch {event['branch']}: {event['stage']}")
        elif event["kind"] == "attempt":
            p, left = event["progress"], event["left"]
            color = "green" if event["verdict"] == "correct" else "red"
            speed = f" {event['speedup_eager']:.2f}x eager" if event["speedup_eager"] is not None else ""
            sol = f" SOL {event['sol_fraction']:.0%}" if event["sol_fraction"] is not None else ""
            why = f" ({event['reasons'][0][:100]})" if event["reasons"] and event["verdict"] != "correct" else ""
            best = (f"best #{p['best_number']}" + (f" {p['best_speedup']:.2f}x" if p["best_speedup"] else "")
                    + (f" SOL {p['best_sol']:.0%}" if p["best_sol"] is not None else "")) if p["best_number"] else "no best yet"
            if p["best_number"] and p["best_speedup"] is None:
                best += " (untimed: no GPU to rank by)"
            what = " ".join(x for x in (event.get("language") or "", attempt_label(event.get("source") or "")) if x)
            what = f" {escape(what)}:" if what else ""
            budget = ", ".join(left_words(left))
            print_line(f"#{event['number']} (branch {event['branch']}){what} [{color}]{event['verdict']}[/]{speed}"
                       f"{sol}{escape(why)} | {best} | left: {budget}")
        elif event["kind"] == "api_error":
            print_line(f"branch {event['branch']}: {event['error']} ({event['failures']} in a row; "
                       "no attempt was spent)")
        elif event["kind"] == "stop":
            print_line(f"branch {event['branch']} stops: {event['reason']}")
        elif event["kind"] == "warning":
            print_line(f"warning: {escape(event['message'])}")


def attempt_label(source: str) -> str:
    """What distinguishes an attempt, in a few words: the offline policy's template and values (its first line), else
    the names of the kernels the source defines."""
    from agent.policies.offline import read_marker

    marker = read_marker(source)
    if marker:
        values = ", ".join(f"{k}={v}" for k, v in (marker.get("values") or {}).items())
        edit = f" ptx_edit={marker['ptx_edit']}" if marker.get("ptx_edit") else ""
        return f"{marker.get('template')}" + (f" {values}" if values else "") + edit
    kernels = re.findall(r"@triton\.jit[^\n]*\n(?:\s*@[^\n]*\n)*\s*def\s+(\w+)", source)
    kernels += re.findall(r"\.entry\s+(\w+)", source)
    return ", ".join(dict.fromkeys(kernels))


def left_words(left: dict) -> list[str]:
    """A budget left, in words: `3 attempts, 2 min, $0.40`."""
    words = {"attempts": lambda v: plural(v, "attempt"), "seconds": lambda v: duration(v / 3600),
             "cost_usd": lambda v: f"${v:.2f}", "tokens": lambda v: plural(v, "token")}
    return [words[k](v) if k in words else f"{v} {k}" for k, v in left.items()]


def budget_words(settings: dict) -> list[str]:
    """A run's budget, in words: `20 attempts, 1 h, patience 20`."""
    words = [plural(settings["max_attempts"], "attempt")]
    if settings.get("hours") is not None:
        words.append(duration(settings["hours"]))
    if settings.get("patience") is not None:
        words.append(f"patience {settings['patience']}")
    return words
