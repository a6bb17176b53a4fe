"""Errors that ranknas reports to a person, not as a traceback."""


class RanknasError(Exception):
    """A mistake in user input (a file, a field, a value) with a message saying what to do.

    The CLI prints the message and exits non-zero; every other exception is a bug.
    """


class SpecError(RanknasError, ValueError):
    """An architecture spec or search-space config that is not valid."""
