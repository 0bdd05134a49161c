"""Errors a user can act on. The CLI prints them without a traceback."""


class UserError(Exception):
    """Base for errors caused by input: a bad file, name or option. The message says what is valid."""
