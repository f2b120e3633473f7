"""A standard output whose reader went away, for the tests of `... | head -1`."""


class ClosedPipe:
    """Stands in for `sys.stdout` after its reader closed the pipe: every write fails."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass

    def reconfigure(self, **unused):
        pass

    def fileno(self):
        raise OSError("no descriptor")

    def isatty(self):
        return False
