"""How a run's progress reads on a terminal or in a log: the graph's events as lines, attempts in a few words.

`ProgressView` is the `on_event` callback that `kloop optimize`, `resume` and `bench` hand to agent.run.run.
"""
from __future__ import annotations

import re
import time

from rich.console import Console
from rich.markup import escape

from agent.output import duration, plural


class ProgressView:
    """Renders the loop's events: the current stage on a spinner (`status`, set while one is shown), one line per
    attempt (with the strategy's pick when it is not refine's "the run's best", attempts n/N, time spent and an
    estimate of the time left), API errors, stops, warnings and what memory kept."""

    def __init__(self, max_attempts: int, console: Console, clock=time.monotonic):
        self.max_attempts = max_attempts
        self.console = console
        self.status = None
        self.clock = clock
        self.started = clock()
        self.seen: dict[str, int] = {}   # attempts logged since this view started, per problem (a suite's lanes)
        self.first: dict[str, float] = {}   # when each problem's first attempt here was logged

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
            why = f" ({shorten(event['reasons'][0], 100)})" if event["reasons"] and event["verdict"] != "correct" else ""
            best = (f"best #{p['best_number']}" + (f" {p['best_speedup']:.2f}x" if p["best_speedup"] else "")
                    + (f" SOL {p['best_sol']:.0%}" if p["best_sol"] is not None else "")) if p["best_number"] else "no best yet"
            if p["best_number"] and p["best_speedup"] is None:
                best += " (untimed: no GPU to rank by)"
            what = " ".join(x for x in (event.get("language") or "", attempt_label(event.get("source") or "")) if x)
            what = f" {escape(what)}:" if what else ""
            pick = escape(pick_words(event.get("pick")))
            print_line(f"#{event['number']} (branch {event['branch']}{pick}){what} [{color}]{event['verdict']}[/]"
                       f"{speed}{sol}{escape(why)} | {best} | {self.budget_line(event.get('problem') or '', p, left)}")
        elif event["kind"] == "api_error":
            print_line(f"branch {event['branch']}: {event['error']} ({event['failures']} in a row; "
                       "no attempt was spent)")
        elif event["kind"] == "stop":
            print_line(f"branch {event['branch']} stops: {event['reason']}")
        elif event["kind"] == "warning":
            print_line(f"warning: {escape(event['message'])}")
        elif event["kind"] == "memory":   # what the run kept for later runs (agent.learn.after_run)
            print_line(escape(event["message"]))

    def budget_line(self, problem: str, p: dict, left: dict) -> str:
        """`5/20 attempts, 42 s elapsed, ~2 min left; $0.40 left`: the attempt budget as n/N, the wall time this
        command has spent, and the time the rest should take at the pace since the first attempt (the start-up
        before it, starters and warm processes, is not paid again), bounded by a time budget's rest."""
        now = self.clock()
        self.seen[problem] = self.seen.get(problem, 0) + 1
        first = self.first.setdefault(problem, now)
        words = [f"{p['attempts']}/{p['attempts'] + left['attempts']} attempts",
                 f"{clock_words(now - self.started)} elapsed"]
        if left["attempts"] and self.seen[problem] > 1:
            eta = (now - first) / (self.seen[problem] - 1) * left["attempts"]
            if "seconds" in left:
                eta = min(eta, left["seconds"])
            words.append(f"~{clock_words(eta)} left")
        rest = left_words({k: v for k, v in left.items() if k not in ("attempts", "seconds")})
        return ", ".join(words) + (f"; {', '.join(rest)} left" if rest else "")


def pick_words(pick: dict | None) -> str:
    """The strategy's pick, briefly, for an attempt line: `, from #4 island 1 cell triton/memory/2`; nothing for refine
    (its parent is always the run's best) or a start from the target alone."""
    if not pick or pick.get("parent") is None or pick["reason"].startswith("refine:"):
        return ""
    return f", from #{pick['parent']}" + (f" island {pick['island']}" if pick.get("island") is not None else "") \
        + (f" cell {pick['cell']}" if pick.get("cell") else "")


def shorten(text: str, width: int) -> str:
    """One line of at most `width` characters, cut at a word boundary (`...` marks the cut)."""
    line = " ".join(text.split())
    if len(line) <= width:
        return line
    cut = line[:width - 3].rsplit(" ", 1)[0] if " " in line[:width - 3] else line[:width - 3]
    return cut.rstrip(" ,;:") + "..."


def clock_words(seconds: float) -> str:
    """Elapsed or remaining time as a person reads it: `42 s`, `3 min 5 s`, `1 h 12 min`."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min" + (f" {seconds % 60} s" if seconds % 60 else "")
    return f"{seconds // 3600} h" + (f" {seconds % 3600 // 60} min" if seconds % 3600 // 60 else "")


def attempt_label(source: str) -> str:
    """What distinguishes an attempt, in a few words: the offline policy's template and values (its first line), else
    the names of the kernels the source defines."""
    from tools.records.store import offline_marker

    marker = offline_marker(source)
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
