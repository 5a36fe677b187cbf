"""l2c's one error type: every rejection of user (or LLM) input names where and why."""
from __future__ import annotations

from typing import Optional


class L2Error(Exception):
    """A problem with a spec: syntax, an out-of-range knob, or a rule the spec breaks.

    Rendered as ``file:line:col: error: [knob] message (rule: name)`` so editors can jump to it.
    """

    def __init__(self, message: str, *, file: str = "<spec>", line: Optional[int] = None,
                 col: Optional[int] = None, knob: Optional[str] = None, rule: Optional[str] = None):
        self.message = message
        self.file = file
        self.line = line
        self.col = col
        self.knob = knob
        self.rule = rule
        super().__init__(self.render())

    def render(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}:{self.col or 1}"
        knob = f"[{self.knob}] " if self.knob else ""
        rule = f" (rule: {self.rule})" if self.rule else ""
        return f"{where}: error: {knob}{self.message}{rule}"


class L2SyntaxError(L2Error):
    """The text is not in the language of grammar/l2.lark."""


class L2ValidationError(L2Error):
    """The spec parses but cannot work on the chosen target and architecture."""


class BuildError(Exception):
    """A generated kernel failed to build; carries the compiler's message. A failed candidate."""


class DataFileError(Exception):
    """A file l2c keeps data in (the tuner's results store or study journal) is damaged or unusable; the message
    names the file and what is wrong with it."""


def describe_os_error(err: OSError) -> str:
    """One line for an OSError: the file(s) it concerns and the system's reason, without the errno."""
    what = err.strerror or str(err)
    if err.filename is not None and err.filename2 is not None:
        return f"{err.filename} -> {err.filename2}: {what}"
    if err.filename is not None:
        return f"{err.filename}: {what}"
    return what


class BenchError(Exception):
    """A problem with what `l2c bench` was asked to do (no GPU, nothing to measure, bad table)."""


class LaunchError(RuntimeError):
    """A built, verified kernel's launch failed (a CUDA error, no kernel image for this GPU, a workspace or
    initialization failure): not the call's fault, and torch can still serve the call."""


class SignatureDeclined(ValueError):
    """A kernel declines a call for what its signature fixes (shapes, strides, dtypes, devices:
    `kernel.call_signature`), so it declines every call of that signature; a plain ValueError declines one call (a
    misaligned pointer)."""
