"""Our commits' userMetadata: "iotlake <operation> <uuid> [<details as JSON>]", written by the table operations
and read back by them (history, restore warnings) and by the stream (devices purged beside it)."""

from __future__ import annotations

import json
import uuid

TAG_PREFIX = "iotlake"
PURGE = "delete-device"


def commit_tag(operation: str, **details: str) -> str:
    """A unique userMetadata for one of our commits: history finds it, and `details` say what it did."""
    tag = f"{TAG_PREFIX} {operation} {uuid.uuid4().hex}"
    return f"{tag} {json.dumps(details, sort_keys=True)}" if details else tag


def parse_tag(user_metadata: str | None) -> tuple[str, dict[str, str]] | None:
    """(operation, details) of a commit_tag; None for any other userMetadata. Unreadable details are {}."""
    parts = (user_metadata or "").split(" ", 3)
    if len(parts) < 3 or parts[0] != TAG_PREFIX:
        return None
    details: dict[str, str] = {}
    if len(parts) == 4:
        try:
            loaded = json.loads(parts[3])
        except ValueError:
            loaded = {}
        if isinstance(loaded, dict):
            details = {str(k): str(v) for k, v in loaded.items()}
    return parts[1], details


def purged_device(user_metadata: str | None) -> str | None:
    """The device a `delete-device` commit purged; None for any other commit (and for tags without the device)."""
    tag = parse_tag(user_metadata)
    return tag[1].get("device_id") if tag is not None and tag[0] == PURGE else None
