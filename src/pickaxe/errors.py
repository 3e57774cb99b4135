"""User-facing errors: the CLI prints these as one line, without a traceback."""


class PickaxeError(Exception):
    """A problem with the user's input (config, recipe, env id, run directory); the message names the fix."""


class ConfigError(PickaxeError, ValueError):
    """An unknown config key or a value of the wrong type."""


class NonFiniteError(RuntimeError):
    """A NaN or Inf in a loss, a gradient or a parameter; raised before the bad update is applied."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what
