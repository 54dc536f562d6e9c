"""Error types shared by the whole package."""


class UserError(Exception):
    """A mistake in the user's input (spec, flags, files).

    The CLI prints it as one line and exits with code 2, without a traceback.
    """


class RunFailed(Exception):
    """A launched run did not finish (a worker died, timed out or could not connect).

    The CLI prints it as one line and exits with code 1.
    """
