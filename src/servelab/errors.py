"""User-facing errors: raised for bad input, printed by the CLI as one line, never a traceback."""


class UserError(Exception):
    """Bad input or environment the user can fix. The message names what is wrong and how to fix it."""
