"""Test-only worker hooks (DUALTRAIN_TEST_HOOK=testkit.worker_hooks:FUNCTION=ARGUMENT)."""

from dualtrain.errors import UserError


def user_error(backend: str, argument: str) -> None:
    """Stop the worker on a user error, as a mistake only a worker can see would."""
    raise UserError(argument)
