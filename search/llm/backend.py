"""The back-end seam: what the proposer asks a language model for, and what one answers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple

Checker = Callable[[str], Tuple[Optional[str], Optional[int]]]   # text -> (rejection reason, culprit offset)


@dataclass
class Sample:
    """One raw generation: `text` when the back end finished one, else `reason`."""
    text: Optional[str]
    reason: str = ""
    backtracks: int = 0


class Backend(Protocol):
    """A language model that writes texts in a grammar's language."""

    name: str   # the model, for the proposals' source (`llm:<name>`)

    def sample(self, messages: Sequence[Dict[str, str]], grammar: str, n: int, temperature: float, seed: int,
               check: Optional[Checker] = None, max_new_tokens: int = 256, max_backtracks: int = 64) -> List[Sample]:
        """`n` samples constrained by `grammar`; with `check`, ones it rejects may be resampled."""
