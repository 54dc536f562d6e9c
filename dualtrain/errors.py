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
