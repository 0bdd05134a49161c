"""Errors a user can act on. The CLI prints them without a traceback."""


class UserError(Exception):
    """Base for errors caused by input: a bad file, name or option. The message says what is valid."""


class ContextLengthExceeded(UserError):
    """A prompt longer than the room the language model's context leaves for it (`needed` > `room` tokens)."""

    code = "context_length_exceeded"

    def __init__(self, message: str, needed: int, room: int):
        super().__init__(message)
        self.needed, self.room = needed, room
