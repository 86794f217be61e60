"""A progress line that suits where it is written: redrawn in place (``\\r``) on a terminal,
at most ten times a second; in a log file or a pipe, one full line every few percent."""
from __future__ import annotations

import time
from typing import Optional, TextIO


class ProgressLine:
    """Shows ``message`` for step ``step`` of ``total``.

    Parameters
    ----------
    total : int
        Steps in all (the last one is always shown).
    stream : file-like
        Where to write (``sys.stderr`` in the commands).
    every_percent : float, optional
        Off a terminal, a line is written each time this share of ``total`` is passed.
    """

    def __init__(self, total: int, stream: TextIO, every_percent: float = 5.0):
        self.total = max(int(total), 1)
        self.stream = stream
        isatty = getattr(stream, "isatty", None)
        self.terminal = bool(isatty()) if callable(isatty) else False
        self.every = max(1, int(self.total * every_percent / 100.0))
        self._last_draw = 0.0
        self._last_logged: Optional[int] = None
        self._open = False  # a redrawn line awaits its newline

    def show(self, step: int, message: str) -> None:
        """Draw (terminal) or log (otherwise) ``message`` when it is due."""
        last = step >= self.total
        if self.terminal:
            now = time.perf_counter()
            if now - self._last_draw > 0.1 or last:
                self._last_draw = now
                self.stream.write("\r" + message + " ")
                self._open = True
                self.stream.flush()
        elif last or self._last_logged is None or step - self._last_logged >= self.every:
            self._last_logged = step
            self.stream.write(message + "\n")
            self.stream.flush()

    def close(self) -> None:
        """End a redrawn line with its newline."""
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False
