"""One root error and a subclass per area; every message names the cause and the fix."""

from __future__ import annotations


class IotLakeError(Exception):
    """Root of every error the product raises on purpose (exit code 2 in the CLIs)."""

    exit_code = 2


class ConfigError(IotLakeError):
    """The configuration is invalid: names the key, the value and what is allowed."""


class CredentialsError(IotLakeError):
    """Storage credentials are missing or refused."""


class ServiceUnreachableError(IotLakeError):
    """Kafka, MinIO or another service did not answer."""


class StorageError(IotLakeError):
    """The object store answered, but not as needed (bucket missing, access denied)."""


class JavaMissingError(IotLakeError):
    """No usable Java runtime for Spark."""


class SessionError(IotLakeError):
    """A Spark session can't be built as asked in this process."""


class CheckpointError(IotLakeError):
    """The checkpoint belongs to a different or incompatible query."""


class VacuumRefusedError(IotLakeError):
    """A VACUUM the safety checks refuse: it could delete files that a reader or the stream still needs."""


class ValidationFailure(IotLakeError):
    """A validation rule whose action is `fail` matched a record: the stream stops."""


class StackError(IotLakeError):
    """The native local stack (install, start, stop) failed."""


class TableOpsError(IotLakeError):
    """A table operation (history, show, restore, changes, delete-device) can't run as asked."""


class UnknownTableError(TableOpsError):
    """The table name is not one of the lake's tables."""


class TableNotCreatedError(TableOpsError):
    """The table has no Delta log yet: the stream has not created it."""


class VersionNotFoundError(TableOpsError):
    """The asked version or time is outside the table's history."""


class InvalidTimestampError(TableOpsError):
    """A --timestamp that is not a time."""


class ConfirmationRequiredError(TableOpsError):
    """A destructive operation without --yes, and no terminal to ask on."""


class ConcurrentWriteError(TableOpsError):
    """Another writer (the stream, the sidecar) committed a conflicting change first."""


def first_line(error: BaseException | str, limit: int = 500) -> str:
    """The first line of an error's text (its class name when empty), cut to `limit` characters."""
    text = str(error).strip()
    if not text:
        return type(error).__name__ if isinstance(error, BaseException) else ""
    return text.splitlines()[0][:limit]


# Delta's optimistic-concurrency losses: another writer (the maintenance sidecar) committed first.
CONFLICTS = (
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "MetadataChangedException",
    "ProtocolChangedException",
)
# Delta's error classes for the same conflicts, as they appear in the message.
CONFLICT_ERROR_CLASSES = ("DELTA_CONCURRENT_", "DELTA_METADATA_CHANGED", "DELTA_PROTOCOL_CHANGED")


def is_conflict(error: BaseException) -> bool:
    """A lost race with another writer of the table (try again), not a real failure.

    delta-spark raises its own classes (`delta.exceptions.captured.ConcurrentAppendException`...), whose
    message carries Delta's error class (`[DELTA_CONCURRENT_APPEND...]`), not the class name.
    """
    if {cls.__name__ for cls in type(error).__mro__} & {*CONFLICTS, "DeltaConcurrentModificationException"}:
        return True
    text = str(error)[:500]
    return any(marker in text for marker in (*CONFLICT_ERROR_CLASSES, *CONFLICTS))
