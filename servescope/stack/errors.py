"""The one error type the stack raises for user-facing problems: its message is the one line printed."""


class StackError(Exception):
    """A problem the user can act on (port in use, missing tool, service not ready): printed, no traceback."""


class ServiceExited(StackError):
    """A supervised service died before it was ready; `code` is its exit status (negative: the signal)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code
