"""The lake's tables, in one place: every command and the job resolve a table through here."""

from __future__ import annotations

from dataclasses import dataclass

from streaming.core.config import Settings, TableConfig
from streaming.core.errors import UnknownTableError

# The config keys of the tables (tables.<key>), also their part of the job's Delta transaction app ids.
TABLE_KEYS = ("readings", "device_state", "quarantine")


@dataclass(frozen=True)
class LakeTable:
    key: str  # readings | device_state | quarantine
    spec: TableConfig  # tables.<key>: the configured name, partitioning, clustering
    uri: str

    @property
    def name(self) -> str:
        return self.spec.name


def lake_tables(settings: Settings) -> list[LakeTable]:
    """The three tables, in the order the job writes them."""
    specs = (getattr(settings.tables, key) for key in TABLE_KEYS)
    return [
        LakeTable(key, spec, settings.storage.table_uri(spec.name)) for key, spec in zip(TABLE_KEYS, specs, strict=True)
    ]


def resolve_table(settings: Settings, name: str) -> LakeTable:
    """The table called `name`: its configured name or its config key."""
    tables = lake_tables(settings)
    for table in tables:
        if name in (table.name, table.key):
            return table
    known = ", ".join(t.name for t in tables)
    raise UnknownTableError(f"Unknown table {name!r}. The lake's tables are: {known}.")


def chosen_tables(settings: Settings, name: str | None) -> list[LakeTable]:
    """All tables, or the one called `name`."""
    return lake_tables(settings) if name is None else [resolve_table(settings, name)]
