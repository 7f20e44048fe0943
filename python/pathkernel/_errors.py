"""The recorder's exception (torch-free, so that the run writer raises it too)."""


class RecorderError(ValueError):
    """The recorder refuses a model, optimizer, data or step it cannot record exactly."""
