"""How every kloop command writes to the terminal, a pipe or a log file (and says no: `fail`).

In a terminal, rich as usual, except that text reaches the terminal without control characters: reasons, labels,
kernels and their output are a candidate's own text, and an escape sequence in them would drive the terminal (clear
it, retitle it, write the clipboard). They are shown as `\x1b`. Without a terminal (piped, redirected, a CI log),
rich would assume 80 columns and wrap or crop: code broken mid-line, table cells cut to "2026-1…". There, `Output`
is as wide as its content, and code is always written as it is, never wrapped, cropped or escaped.
"""
from __future__ import annotations

import math

from rich.console import Console, ConsoleDimensions
from rich.segment import Segment

# Width used when no terminal is attached: wide enough that no table or line is ever wrapped or cropped.
UNBOUNDED = 100_000
# C0 controls but tab and newline, DEL and the C1 controls: shown, never sent to a terminal as they are
SHOWN_ESCAPED = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0)]}


class Output(Console):
    """A rich Console that has no width limit when it is not writing to a terminal."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self.is_terminal:
            return size
        return ConsoleDimensions(UNBOUNDED, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)

    def _render_buffer(self, buffer) -> str:
        """rich's own control segments (a status line's cursor moves) go through; text is escaped first. Styles are
        applied after this, so kloop's colours stay."""
        if self.is_terminal:
            buffer = [segment if segment.control else Segment(segment.text.translate(SHOWN_ESCAPED), segment.style)
                      for segment in buffer]
        return super()._render_buffer(buffer)


def make_console(stderr: bool = False) -> Output:
    return Output(stderr=stderr)


def fail(message: str, code: int = 2):
    """One clear line on stderr and exit status 2: how every kloop command reports bad input. The message is plain
    text (a path like runs/[x].db is not read as rich markup)."""
    import typer
    from rich.text import Text

    make_console(stderr=True).print(Text.assemble(("error:", "bold red"), " ", message), highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def print_code(console: Console, source: str, language: str = "python") -> None:
    """Source code exactly as it is (valid Python when piped: never wrapped, never cropped); highlighted in a
    terminal."""
    if console.is_terminal and language == "python":
        from rich.syntax import Syntax

        text = Syntax(source, "python", theme="ansi_dark").highlight(source)
        text.rstrip()
        console.print(text, soft_wrap=True)
    else:
        console.out(source.rstrip("\n"), highlight=False)


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """`1 attempt`, `2 attempts`, `0 shapes`."""
    return f"{count} {noun if count == 1 else (plural_form or noun + 's')}"


def duration(hours: float) -> str:
    """A time budget in words a person would use: `1 min`, `90 s`, `1.5 h`, `2 h 30 min`."""
    seconds = hours * 3600
    if not math.isfinite(seconds):
        return f"{hours:g} h"
    if seconds < 60:
        return f"{seconds:.3g} s"
    if seconds < 3600:
        minutes = seconds / 60
        return f"{minutes:.0f} min" if abs(minutes - round(minutes)) < 0.05 else f"{minutes:.1f} min"
    whole, rest = divmod(round(seconds / 60), 60)
    return f"{whole} h" + (f" {rest} min" if rest else "")
