"""The native local stack: install, start, stop and inspect Kafka and MinIO on loopback.

    from stack.api import install, up, down, status      # all four public operations
    from stack import up, down, status, ensure_topic, StackLayout, Installed

`install` is not re-exported here: `stack.install` is the module (cached Kafka jars, MinIO binary).
"""

from stack.api import down, status, up
from stack.install import Installed
from stack.kafka import ensure_topic
from stack.layout import StackLayout

__all__ = ["Installed", "StackLayout", "down", "ensure_topic", "status", "up"]
