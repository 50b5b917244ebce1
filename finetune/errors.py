"""The one exception type for user mistakes: the CLI prints its message on one line and exits 2."""


class UserError(Exception):
    """A mistake in the user's input (recipe, file, task): reported without a traceback."""
