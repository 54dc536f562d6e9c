"""Error types shared by the whole package."""


class UserError(Exception):
    """A mistake in the user's input (spec, flags, files).

    The CLI prints it as one line and exits with code 2, without a traceback.
    """


class RunFailed(Exception):
    """A launched run did not finish (a worker died, timed out or could not connect).

    The CLI prints it as one line and exits with code 1. ``rank``: the failing worker, when one is
    known; ``code``: its exit code (2: it stopped on a user error, which a restart would not fix).
    """

    def __init__(self, message: str, *, rank: int | None = None, code: int | None = None):
        super().__init__(message)
        self.rank, self.code = rank, code
