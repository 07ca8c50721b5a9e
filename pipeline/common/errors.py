"""Exceptions for user mistakes: the CLI prints their message without a traceback."""


class UserError(ValueError):
    """Bad input from the user (a config, a corpus file, an argument); the message says how to fix it."""


class CorpusError(UserError):
    """A corpus file that cannot be read as a parallel corpus; the message names file and line."""
