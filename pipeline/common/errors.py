"""The one exception type for user mistakes: the CLI prints its message without a traceback."""


class UserError(ValueError):
    """Bad input from the user (a config, a corpus file, an argument); the message says how to fix it."""
