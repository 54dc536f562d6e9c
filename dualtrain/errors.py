"""Error types shared by the whole package."""


class UserError(Exception):
    """A mistake in the user's input (spec, flags, files).

    The CLI prints it as one line and exits with code 2, without a traceback.
    """


class RunFailed(Exception):
    """A launched run did not finish (a worker died, timed out or could not connect).

    The CLI prints it as one line and exits with code 1. ``rank``: the failing worker, when one is
    known; ``code``: its exit code (2: it stopped on a user error, which a restart would not fix);
    ``hard_exit``: this process's communication library is left broken (a collective failed on a
    lost peer), so the process must end without interpreter teardown: joining the library's
    threads at exit can abort the process (SIGABRT, "terminate called without an active
    exception") or stall it, and the exit code would no longer say what happened.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        code: int | None = None,
        hard_exit: bool = False,
    ):
        super().__init__(message)
        self.rank, self.code, self.hard_exit = rank, code, hard_exit


#: the longest value a ``Received:`` shows, in characters
SHOWN_CHARS = 300


def shown(value: object) -> str:
    """``value`` as an error's ``Received:`` shows it, on one line: plain values (numbers, strings,
    lists and dicts of them) as their repr, cut at SHOWN_CHARS; anything else (a pandas DataFrame,
    a NumPy array, a tensor) by its type and shape, never its content, which would print the whole
    frame into a message meant to be one line."""
    text = _plain(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _plain(value: object) -> str:
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_plain(v) for v in value)
        if isinstance(value, list):
            return f"[{inner}]"
        return f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_plain(k)}: {_plain(v)}" for k, v in value.items()) + "}"
    shape = getattr(value, "shape", None)
    kind = type(value).__name__
    if shape == ():  # a NumPy scalar
        return repr(value)
    vowel = kind[:1].lower() in "aeiou" and not kind.lower().startswith(("use", "uni", "eu"))
    a = "an" if vowel or kind == "ndarray" else "a"
    if isinstance(shape, tuple) and all(isinstance(n, int) for n in shape):
        if hasattr(value, "columns") and len(shape) == 2:  # a DataFrame
            return f"{a} {kind} of {shape[0]} rows x {shape[1]} columns"
        dtype = str(getattr(value, "dtype", None)).removeprefix("torch.")
        shape = tuple(shape)  # torch.Size([4]) as (4,)
        return f"{a} {kind} ({dtype}, shape {shape})" if dtype != "None" else f"{a} {kind}"
    return f"{a} {kind}"
