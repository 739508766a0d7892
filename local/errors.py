"""The one error a local run reports without a traceback."""


class StartupFailure(Exception):
    """The run cannot start or become ready; the message says what is wrong and what to do."""
