"""One base class for the errors a user can fix: bad settings, data, model, run folder, busy job.

The CLI and the UI catch :class:`UserError` (one list) and show its message; anything else is a
bug and keeps its traceback. Each subclass stays where it is raised (``config.ConfigError``,
``data.text.DataError``...) and also keeps its old builtin base (ValueError / RuntimeError), so
existing ``except ValueError`` code keeps working.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix; the message names the file, field or value."""


# What every front end catches and shows as one line (the CLI prints "error: ...", the dashboard
# shows the message): bad settings, data, model, run folder, export, a busy job.
USER_ERRORS: tuple[type[Exception], ...] = (UserError,)

MESSAGE_VALUE_CHARS = 80  # a typed value quoted in a message is cut to this many characters


def cut(text: object, most: int = MESSAGE_VALUE_CHARS) -> str:
    """``str(text)`` cut to ``most`` characters with the full length named, so a message never
    echoes a long input back whole (a 100,000-character run name gives one short line)."""
    text = str(text)
    return text if len(text) <= most else f"{text[:most]}... ({len(text):,} characters)"


def clip(value: object, most: int = MESSAGE_VALUE_CHARS) -> str:
    """``repr(value)`` cut as :func:`cut` does (a typed value quoted in a message)."""
    text = repr(value)
    if len(text) <= most:
        return text
    return f"{text[:most]}... ({len(str(value)):,} characters)"
