"""Errors a user can act on. The CLI prints them as one `error:` line and exits 2, no traceback."""


class DormouseError(Exception):
    """Base class: a refusal with a message that names the offending field, file or value."""


class ConfigError(DormouseError):
    pass


class DataError(DormouseError):
    pass


class CheckpointError(DormouseError):
    pass
