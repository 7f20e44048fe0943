"""The recorder's exception (torch-free, so that the run writer raises it too)."""


class RecorderError(ValueError):
    """The recorder refuses a model, optimizer, data or step it cannot record exactly."""

    # Shown (and pickled) as pathkernel.record.RecorderError, where users import it from.
    __module__ = "pathkernel.record"
