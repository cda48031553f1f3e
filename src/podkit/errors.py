"""podkit's exceptions. Each message names the bad value and the fix."""


class PodkitError(Exception):
    """Base class of podkit's errors."""


class ConfigError(PodkitError, ValueError):
    """A configuration, argument or flag has a bad value."""


class ConnectError(PodkitError, RuntimeError):
    """Devices or processes could not be joined."""


class InputError(PodkitError, ValueError):
    """Training, evaluation or prediction data does not fit the model or the strategy."""
