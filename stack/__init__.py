"""The native local stack: install, start, stop and inspect Kafka and MinIO on loopback.

    from stack.api import install, up, down, status      # all four public operations
    from stack import up, down, status, ensure_topic, StackLayout, Installed

`install` is not re-exported here: `stack.install` is the module (cached Kafka jars, MinIO binary).
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use, so that `import stack.supervise` (iotlake's parser) doesn't load the MinIO and Kafka clients.
_EXPORTS = {
    "down": "stack.api",
    "status": "stack.api",
    "up": "stack.api",
    "Installed": "stack.install",
    "ensure_topic": "stack.kafka",
    "StackLayout": "stack.layout",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'stack' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
