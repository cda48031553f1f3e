"""podkit's exceptions. Each message names the bad value and the fix."""


class PodkitError(Exception):
    """Base class of podkit's errors."""


class ConfigError(PodkitError, ValueError):
    """A configuration, argument or flag has a bad value."""


class ConnectError(PodkitError, RuntimeError):
    """Devices or processes could not be joined."""


class InputError(PodkitError, ValueError):
    """Training, evaluation or prediction data does not fit the model or the strategy."""


class DataError(PodkitError, RuntimeError):
    """A user function in an input pipeline failed on one element.

    Carries the element's index and the original traceback as text, so it survives the trip
    from an input worker process to the consumer.
    """

    def __init__(self, message: str, index: int | None = None, traceback: str = "") -> None:
        super().__init__(message, index, traceback)
        self.index, self.traceback = index, traceback

    def __str__(self) -> str:
        return self.args[0] + (f"\n\nOriginal traceback:\n{self.traceback}" if self.traceback
                               else "")


class TrainingError(PodkitError, RuntimeError):
    """Training cannot go on: a NaN or infinite loss (on_nan="stop"), nothing to roll back to."""


class DeviceMemoryError(ConfigError):
    """A compiled step needs more memory per device than a device holds (found before the
    first step: nothing ran)."""


class RecompileError(ConfigError):
    """A step compiled again under compile(strict_recompiles=True)."""


class SubmitError(PodkitError, RuntimeError):
    """A cluster engine refused a job, or its tools (sbatch, kubectl) could not run."""


class StorageError(PodkitError, RuntimeError):
    """Reading or writing checkpoint storage failed. `transient`: the cause was temporary
    (retried until the policy gave up); `missing`: the object does not exist."""

    transient: bool = False
    missing: bool = False


def user_stacklevel() -> int:
    """The `stacklevel` that makes `warnings.warn`, called from podkit, name the user's line
    (the first frame outside the podkit package), whatever path led there (fit or
    train_on_batch)."""
    import inspect
    import os

    package = os.path.dirname(os.path.abspath(__file__))
    here = inspect.currentframe()
    frame, level = (here.f_back if here is not None else None), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level
