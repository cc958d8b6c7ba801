"""Typed, frozen configuration: YAML file, then environment overrides, validated once at start-up.

pydantic-settings reads the sources (IOTLAKE_<SECTION>__<KEY> over the YAML file) and pydantic validates them into
frozen pydantic dataclasses: `dataclasses.replace` keeps working on them, and checks what it builds.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import yaml
from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    SecretStr,
    TypeAdapter,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict, YamlConfigSettingsSource

from streaming.errors import ConfigError

ENV_PREFIX = "IOTLAKE_"
ENV_NESTING = "__"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG_PATH = PROJECT_ROOT / "config" / "default.yaml"
# kafka.options and spark.conf keys whose values are shown as '***' (case-insensitive): passwords, JAAS configs
# (they embed one), tokens, credentials, private keys, and S3 keys like Spark's own redaction.
SECRET_KEY_PATTERN = re.compile(
    r"password|passwd|secret|token|jaas|credential|access[._-]?key|private[._-]?key|keystore[._-]key",
    re.IGNORECASE,
)
OPTION_MAPPINGS = (("kafka", "options"), ("spark", "conf"))


def is_secret_key(key: str) -> bool:
    """True for an option or conf key whose value must never be shown or logged."""
    return bool(SECRET_KEY_PATTERN.search(key))


ACTIONS = ("quarantine", "drop", "warn", "fail")
# Rules whose records can't become a reading: keeping them (`warn`) is not an option.
STRUCTURAL_RULES = frozenset(
    {
        "empty_value",
        "invalid_utf8",
        "message_too_large",
        "malformed_json",
        "not_json_object",
        "missing_field",
        "wrong_type",
        "unknown_schema_version",
        "unexpected_field",
        "type_conflict",
        "unstorable_event_time",
    }
)
VALUE_RULES = frozenset({"out_of_range", "event_time_in_future", "event_time_too_old"})
ALL_RULES = STRUCTURAL_RULES | VALUE_RULES
# put_if_absent: commits with a conditional PUT, safe with two writer processes (streaming/logstore.py).
# single_driver: Delta's S3SingleDriverLogStore, safe with one writer process only.
LOG_STORES = ("put_if_absent", "single_driver")

_DURATION = re.compile(r"^\s*(?:interval\s+)?(\d+(?:\.\d+)?)\s*([a-z]+)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), 0.001),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
    **dict.fromkeys(("w", "week", "weeks"), 604800.0),
}


def _seconds(text: str | int | float) -> float:
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    match = _DURATION.match(str(text))
    if not match or match.group(2).lower() not in _UNIT_SECONDS:
        raise ValueError(
            f"{text!r} is not a duration. Use a number and a unit, e.g. '30 seconds', '5 minutes', '2 hours', '7 days'."
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]


def parse_duration(text: str | int | float, key: str) -> float:
    """Seconds in '5 minutes', '7 days', 'interval 30 days', '250 ms' or a bare number of seconds."""
    try:
        return _seconds(text)
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None


def _check_duration(text: str) -> str:
    _seconds(text)
    return text


# A duration as written ('5 minutes', 'interval 30 days': Delta and Spark take the text), checked when the config is
# built; the sections' `*_s` properties give its seconds. pydantic's timedelta reads neither form.
Duration = Annotated[str, AfterValidator(_check_duration)]
# A secret: repr() and str() show '**********', `iotlake config` '***'; .get_secret_value() (or reveal()) reads it.
Secret = Annotated[SecretStr, PlainSerializer(lambda s: "***" if s.get_secret_value() else "", when_used="json")]
# Entries of kafka.options, spark.conf and validation.actions: YAML numbers and booleans become text.
Text = Annotated[str, BeforeValidator(str)]
# Unknown keys are errors; a YAML number is fine where text is expected (topic: 123).
_SECTION = ConfigDict(extra="forbid", coerce_numbers_to_str=True)


def reveal(secret: SecretStr | None) -> str | None:
    """A secret's text, for the one client that needs it (None when unset)."""
    return secret.get_secret_value() if secret is not None else None


def _check(ok: object, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True, config=_SECTION)
class KafkaConfig:
    bootstrap_servers: str = "127.0.0.1:9092"
    topic: str = "sensor-readings"
    partitions: int = 6
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int = 250_000
    fail_on_data_loss: bool = True
    options: dict[Text, Text] = field(default_factory=dict)
    # Native stack only: node 1 also offers a SASL_PLAINTEXT (PLAIN) listener on this loopback port (0: none).
    sasl_listener_port: int = 0

    @model_validator(mode="after")
    def _valid(self) -> KafkaConfig:
        _check(self.bootstrap_servers.strip(), "kafka.bootstrap_servers is empty. Set it to host:port[,host:port].")
        _check(self.partitions >= 1, f"kafka.partitions must be >= 1, got {self.partitions}.")
        _check(
            self.starting_offsets in ("earliest", "latest"),
            f"kafka.starting_offsets must be 'earliest' or 'latest', got {self.starting_offsets!r}.",
        )
        _check(self.max_offsets_per_trigger >= 1, "kafka.max_offsets_per_trigger must be >= 1.")
        _check(
            0 <= self.sasl_listener_port <= 65535,
            "kafka.sasl_listener_port must be 0..65535 (0: the native stack offers no SASL listener), "
            f"got {self.sasl_listener_port}.",
        )
        return self


@dataclass(frozen=True, config=_SECTION)
class StorageConfig:
    base_uri: str = "s3a://iotlake/lake"
    endpoint: str = "http://127.0.0.1:9000"
    region: str = "us-east-1"
    path_style_access: bool = True
    ssl_enabled: bool = False
    secrets_file: str = "var/secrets.env"
    access_key: Secret | None = None
    secret_key: Secret | None = None
    log_store: str = "put_if_absent"

    @model_validator(mode="after")
    def _valid(self) -> StorageConfig:
        _check(
            re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:/", self.base_uri),
            f"storage.base_uri {self.base_uri!r} needs a scheme, e.g. s3a://BUCKET/prefix or file:/path.",
        )
        _check(
            self.log_store in LOG_STORES,
            f"storage.log_store must be one of {list(LOG_STORES)}, got {self.log_store!r}. put_if_absent "
            "is safe with two writer processes; single_driver only with one.",
        )
        return self

    @property
    def bucket(self) -> str:
        """The bucket named by base_uri (s3a://BUCKET/prefix)."""
        return self.base_uri.split("://", 1)[1].split("/", 1)[0]

    @property
    def is_s3(self) -> bool:
        return self.base_uri.startswith(("s3a://", "s3://"))

    def table_uri(self, name: str) -> str:
        return f"{self.base_uri.rstrip('/')}/{name}"


@dataclass(frozen=True, config=_SECTION)
class SparkConfig:
    master: str = "local[2]"
    app_name: str = "iotlake-ingest"
    ivy_cache: str = "~/.cache/iotlake/ivy"
    driver_memory: str = "2g"
    conf: dict[Text, Text] = field(default_factory=dict)
    # spark.authenticate's shared secret for a spark:// master (the native cluster's: IOTLAKE_SPARK_AUTH_SECRET in
    # the secrets file). It reaches the driver through a 0600 properties file, never its command line.
    auth_secret: Secret | None = None
    # A spark:// cluster whose workers hold the same Ivy cache at the same path (the native cluster, the compose
    # image): executors load the jars from there instead of copying them (~750 MB) into each application's dir.
    preinstalled_jars: bool = False


@dataclass(frozen=True, config=_SECTION)
class SparkClusterConfig:
    """The native Spark standalone cluster (`python -m stack up --cluster`), on loopback."""

    master_port: int = 7077
    webui_port: int = 8080  # the master's web UI and its /json/ status
    worker_cores: int = 1
    worker_memory: str = "2g"  # what the worker offers its executors (spark.executor.memory must fit)

    @model_validator(mode="after")
    def _valid(self) -> SparkClusterConfig:
        for key, port in (("master_port", self.master_port), ("webui_port", self.webui_port)):
            _check(1 <= port <= 65535, f"spark_cluster.{key} must be 1..65535, got {port}.")
        _check(
            self.master_port != self.webui_port, "spark_cluster.master_port and spark_cluster.webui_port must differ."
        )
        _check(self.worker_cores >= 1, f"spark_cluster.worker_cores must be >= 1, got {self.worker_cores}.")
        _check(
            re.fullmatch(r"[1-9][0-9]*[mg]", self.worker_memory),
            f"spark_cluster.worker_memory {self.worker_memory!r} must be a size like 2g or 1536m.",
        )
        return self


@dataclass(frozen=True, config=_SECTION)
class IngestConfig:
    checkpoint_location: str = "checkpoints/ingest"
    trigger_interval: Duration = "1 second"
    metrics_port: int = 9108
    metrics_host: str = "127.0.0.1"
    checkpoint_lease_ttl: Duration = "60 seconds"  # an s3a:// checkpoint's lock: a dead job's lease expires after this

    @model_validator(mode="after")
    def _valid(self) -> IngestConfig:
        _check(
            self.checkpoint_lease_ttl_s >= 10,
            f"ingest.checkpoint_lease_ttl must be at least 10 seconds (renewed every third of it), "
            f"got {self.checkpoint_lease_ttl!r}.",
        )
        _check(0 <= self.metrics_port <= 65535, f"ingest.metrics_port must be 0..65535, got {self.metrics_port}.")
        return self

    @property
    def checkpoint_uri(self) -> str:
        """The checkpoint as Spark and Hadoop take it: a URI as given, a local path resolved from the project root."""
        location = self.checkpoint_location
        return location if "://" in location else str(resolve_path(location))

    @property
    def checkpoint_lease_ttl_s(self) -> float:
        return parse_duration(self.checkpoint_lease_ttl, "ingest.checkpoint_lease_ttl")


def _table_name(name: str) -> str:
    _check(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), f"{name!r} must be letters, digits and underscores.")
    return name


@dataclass(frozen=True, config=_SECTION)
class TableConfig:
    """One table's name and layout: partitions + Z-ORDER columns, or liquid clustering (`cluster_by`)."""

    name: Annotated[str, AfterValidator(_table_name)]
    partition_by: tuple[str, ...] = ()
    zorder_by: tuple[str, ...] = ()
    cluster_by: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _valid(self) -> TableConfig:
        _check(
            not (self.cluster_by and (self.partition_by or self.zorder_by)),
            "cluster_by (liquid clustering) can't be combined with partition_by or zorder_by. "
            "Set partition_by: [] and zorder_by: [] to cluster, or drop cluster_by.",
        )
        return self


_TABLES = {
    "readings": TableConfig("readings", ("event_date",), ("device_id",)),
    "device_state": TableConfig("device_state"),
    "quarantine": TableConfig("quarantine", ("ingest_date",)),
}


@dataclass(frozen=True, config=_SECTION)
class TablesConfig:
    readings: TableConfig = _TABLES["readings"]
    device_state: TableConfig = _TABLES["device_state"]
    quarantine: TableConfig = _TABLES["quarantine"]
    log_retention: Duration = "interval 30 days"
    deleted_file_retention: Duration = "interval 7 days"

    @model_validator(mode="before")
    @classmethod
    def _tables_given_in_part(cls, data: Any) -> Any:
        """A table given in part keeps the rest of its defaults: `readings: {cluster_by: [...]}` is still 'readings'."""
        if not isinstance(data, dict):
            return data
        given = {k: v for k, v in data.items() if k in _TABLES and (v is None or isinstance(v, dict))}
        return {**data, **{k: {**asdict(_TABLES[k]), **(v or {})} for k, v in given.items()}}


@dataclass(frozen=True, config=_SECTION)
class MaintenanceConfig:
    """The sidecar (`iotlake maintain`): when to compact and vacuum, and how to back off on conflicts."""

    enabled: bool = True
    interval: Duration = "5 minutes"
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9109
    small_file_mb: float = 32.0
    target_file_size_mb: float = 128.0
    min_small_files: int = 10
    min_small_file_ratio: float = 0.5
    open_partition_min_small_files: int = 200
    close_after: Duration = "1 hour"
    vacuum_interval: Duration = "1 day"
    retry_backoff: Duration = "30 seconds"
    max_backoff: Duration = "30 minutes"

    @model_validator(mode="after")
    def _valid(self) -> MaintenanceConfig:
        _check(
            self.interval_s > 0 and self.retry_backoff_s > 0 and self.max_backoff_s >= self.retry_backoff_s,
            "maintenance.interval and retry_backoff must be > 0, and max_backoff >= retry_backoff.",
        )
        _check(0 <= self.metrics_port <= 65535, f"maintenance.metrics_port must be 0..65535, got {self.metrics_port}.")
        _check(
            0 < self.small_file_mb < self.target_file_size_mb,
            f"maintenance.small_file_mb ({self.small_file_mb}) must be > 0 and below target_file_size_mb "
            f"({self.target_file_size_mb}): a file is small when it is well under the size compaction aims for.",
        )
        _check(
            self.min_small_files >= 2 and self.open_partition_min_small_files >= self.min_small_files,
            "maintenance.min_small_files must be >= 2 (one file can't be compacted), and "
            "open_partition_min_small_files >= min_small_files (the open partition has the higher bar).",
        )
        _check(
            0 < self.min_small_file_ratio <= 1,
            f"maintenance.min_small_file_ratio must be in (0, 1], got {self.min_small_file_ratio}.",
        )
        return self

    @property
    def interval_s(self) -> float:
        return parse_duration(self.interval, "maintenance.interval")

    @property
    def close_after_s(self) -> float:
        return parse_duration(self.close_after, "maintenance.close_after")

    @property
    def vacuum_interval_s(self) -> float:
        return parse_duration(self.vacuum_interval, "maintenance.vacuum_interval")

    @property
    def retry_backoff_s(self) -> float:
        return parse_duration(self.retry_backoff, "maintenance.retry_backoff")

    @property
    def max_backoff_s(self) -> float:
        return parse_duration(self.max_backoff, "maintenance.max_backoff")

    @property
    def small_file_bytes(self) -> int:
        return int(self.small_file_mb * 2**20)

    @property
    def target_file_bytes(self) -> int:
        return int(self.target_file_size_mb * 2**20)


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class Range:
    min: float
    max: float

    @model_validator(mode="after")
    def _valid(self) -> Range:
        _check(self.min <= self.max, f"min ({self.min}) must be <= max ({self.max}).")
        return self


@dataclass(frozen=True, config=_SECTION)
class ValidationConfig:
    schema_versions: tuple[int, ...] = (1,)
    required: tuple[str, ...] = ("event_id", "device_id", "parcel_id", "seq", "event_time", "schema_version")
    ranges: dict[Text, Range] = field(default_factory=dict)
    max_future_skew: Duration = "5 minutes"
    max_lateness: Duration = "7 days"
    max_message_bytes: int = 65536
    actions: dict[Text, Text] = field(default_factory=dict)

    @model_validator(mode="after")
    def _valid(self) -> ValidationConfig:
        _check(
            self.max_future_skew_s >= 0 and self.max_lateness_s > 0,
            "validation.max_future_skew must be >= 0 and validation.max_lateness > 0.",
        )
        _check(self.max_message_bytes >= 1, "validation.max_message_bytes must be >= 1.")
        for rule, action in self.actions.items():
            _check(rule in ALL_RULES, f"validation.actions.{rule}: unknown rule. Known rules: {sorted(ALL_RULES)}.")
            allowed = ACTIONS if rule in VALUE_RULES else tuple(a for a in ACTIONS if a != "warn")
            _check(
                action in allowed,
                f"validation.actions.{rule}: {action!r} is not allowed. Choose one of {list(allowed)}.",
            )
        missing_required = {"event_id", "device_id", "event_time", "seq"} - set(self.required)
        _check(
            not missing_required,
            f"validation.required must include {sorted(missing_required)}: readings are keyed by event_id and "
            "device_state is ordered by (event_time, seq).",
        )
        return self

    @property
    def max_future_skew_s(self) -> float:
        return parse_duration(self.max_future_skew, "validation.max_future_skew")

    @property
    def max_lateness_s(self) -> float:
        return parse_duration(self.max_lateness, "validation.max_lateness")


@dataclass(frozen=True, config=_SECTION)
class SchemaEvolutionConfig:
    add_new_fields: bool = False


@dataclass(frozen=True, config=_SECTION)
class MonitoringConfig:
    prometheus_host: str = "127.0.0.1"
    prometheus_port: int = 9090
    scrape_interval: Duration = "5 seconds"

    @model_validator(mode="after")
    def _valid(self) -> MonitoringConfig:
        _check(
            1 <= self.prometheus_port <= 65535,
            f"monitoring.prometheus_port must be 1..65535, got {self.prometheus_port}.",
        )
        _check(
            1 <= self.scrape_interval_s <= 300 and self.scrape_interval_s == int(self.scrape_interval_s),
            f"monitoring.scrape_interval must be whole seconds between 1 second and 5 minutes, "
            f"got {self.scrape_interval!r}.",
        )
        return self

    @property
    def scrape_interval_s(self) -> float:
        return parse_duration(self.scrape_interval, "monitoring.scrape_interval")


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class Settings:
    kafka: KafkaConfig = KafkaConfig()
    storage: StorageConfig = StorageConfig()
    spark: SparkConfig = SparkConfig()
    spark_cluster: SparkClusterConfig = SparkClusterConfig()
    ingest: IngestConfig = IngestConfig()
    tables: TablesConfig = TablesConfig()
    validation: ValidationConfig = ValidationConfig()
    schema_evolution: SchemaEvolutionConfig = SchemaEvolutionConfig()
    maintenance: MaintenanceConfig = MaintenanceConfig()
    monitoring: MonitoringConfig = MonitoringConfig()
    source: str = ""

    def masked(self) -> dict[str, Any]:
        """The effective config as plain data, secrets replaced by '***' (or null when unset)."""
        data: dict[str, Any] = TypeAdapter(Settings).dump_python(self, mode="json")
        for section, name in OPTION_MAPPINGS:
            values = data[section][name]
            data[section][name] = {k: "***" if v and is_secret_key(k) else v for k, v in values.items()}
        return data

    def to_json(self) -> str:
        return json.dumps(self.masked(), indent=2, sort_keys=True)


class _SourcesConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTING, extra="forbid", frozen=True
    )


# Settings' sections as the model pydantic-settings fills (one list of sections: Settings').
_SECTIONS: dict[str, Any] = {k: (t, getattr(Settings, k)) for k, t in get_type_hints(Settings).items() if k != "source"}
_Sections = create_model("_Sections", __base__=_SourcesConfig, **_SECTIONS)


class _EnvSource(EnvSettingsSource):
    """IOTLAKE_<SECTION>__<KEY> from `env`, values parsed as YAML (numbers, booleans, [lists], {mappings}).

    A single kafka.options or spark.conf entry keeps its dots and case and stays text (a JAAS config or a password
    is not YAML): IOTLAKE_SPARK__CONF__spark.sql.shuffle.partitions=4, IOTLAKE_KAFKA__OPTIONS__kafka.sasl.jaas.config=
    """

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        super().__init__(settings_cls, case_sensitive=False)
        self.paths: list[list[str]] = []  # what the environment sets, e.g. ['spark', 'conf', 'spark.ui.enabled']
        self.env_vars = {}
        for name, value in env.items():
            if not name.startswith(ENV_PREFIX) or ENV_NESTING not in name:
                continue
            path = name[len(ENV_PREFIX) :].split(ENV_NESTING)
            keep_case = tuple(part.lower() for part in path[:2]) in OPTION_MAPPINGS and len(path) == 3
            path = [part if keep_case and i == 2 else part.lower() for i, part in enumerate(path)]
            if path[0] not in settings_cls.model_fields:
                raise ConfigError(
                    f"{name}: no config section {path[0]!r}. Sections: {sorted(settings_cls.model_fields)}."
                )
            self.paths.append(path)
            self.env_vars[ENV_PREFIX.lower() + ENV_NESTING.join(path)] = value

    def decode_complex_value(self, field_name: str, field: Any, value: Any) -> Any:
        try:
            return yaml.safe_load(value)
        except yaml.YAMLError:
            return value  # pydantic then says what the key takes


class _YamlSource(YamlConfigSettingsSource):
    """The YAML file, less what the environment sets: IOTLAKE_VALIDATION__RANGES='{...}' replaces the file's ranges
    (pydantic-settings would merge the two, and a mapping could never shrink from the environment)."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path, replaced: list[list[str]]) -> None:
        self.replaced = replaced
        super().__init__(settings_cls, yaml_file=path)

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        try:
            data = yaml.safe_load(file_path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"Config file {file_path} is not valid YAML: {e}") from e
        if not isinstance(data, dict):
            raise ConfigError(f"Config file {file_path} must hold a mapping of sections, not {type(data).__name__}.")
        for path in self.replaced:
            node: Any = data
            for key in path[:-1]:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.pop(path[-1], None)
        return {section: values for section, values in data.items() if values is not None}


def _explain(error: ValidationError) -> str:
    """pydantic's errors as the project's: one line each, naming the dotted key, what it got and what it takes."""
    lines = []
    for problem in error.errors():
        loc = tuple(str(part) for part in problem["loc"])
        where = ".".join(loc)
        if problem["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            lines.append(f"Unknown key {where}.{_allowed(loc[:-1])}")
            continue
        message = problem["msg"].removeprefix("Value error, ")
        if not message.startswith(where):
            message = f"{where}: {message}"
        if problem["type"] not in ("value_error", "missing"):
            message += f", got {problem['input']!r}"
        lines.append(message if message.endswith(".") else message + ".")
    return "\n".join(lines)


def _allowed(loc: tuple[str, ...]) -> str:
    node: Any = Settings
    for key in loc:
        node = get_type_hints(node).get(key) if is_dataclass(node) else None
    names = [f.name for f in fields(node) if f.name != "source"] if is_dataclass(node) else []
    return f" Allowed: {sorted(names)}." if names else ""


def load_settings(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Read the YAML file (default: config/default.yaml), apply IOTLAKE_* overrides, validate."""
    env = os.environ if env is None else env
    config_path = Path(path or env.get("IOTLAKE_CONFIG") or DEFAULT_CONFIG_PATH)
    if not config_path.is_file():
        raise ConfigError(
            f"Config file {config_path} does not exist. Pass --config PATH or set IOTLAKE_CONFIG; "
            f"the committed default is {DEFAULT_CONFIG_PATH}."
        )
    env_source = _EnvSource(_Sections, env)
    sources = (env_source, _YamlSource(_Sections, config_path, env_source.paths))
    try:
        sections = _Sections(_build_sources=(sources, {}))  # type: ignore[call-arg]  # documented; mypy sees fields
        return _with_secrets(Settings(**dict(sections), source=str(config_path)))
    except ValidationError as e:
        raise ConfigError(_explain(e)) from None


def read_secrets_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of the generated secrets file; missing file -> empty."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def resolve_path(path: str, base: Path = PROJECT_ROOT) -> Path:
    """A config path: absolute as is, `~` expanded, relative to the project root."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else base / p


def _with_secrets(settings: Settings) -> Settings:
    """The writer's key and, for a spark:// master, Spark's auth secret, from the secrets file unless set."""
    storage, spark = settings.storage, settings.spark
    wants_auth = spark.master.startswith("spark://") and not spark.auth_secret
    if storage.access_key and storage.secret_key and not wants_auth:
        return settings
    secrets = {name: SecretStr(value) for name, value in read_secrets_file(resolve_path(storage.secrets_file)).items()}
    access = storage.access_key or secrets.get("IOTLAKE_WRITER_ACCESS_KEY")
    secret = storage.secret_key or secrets.get("IOTLAKE_WRITER_SECRET_KEY")
    auth = spark.auth_secret or (secrets.get("IOTLAKE_SPARK_AUTH_SECRET") if wants_auth else None)
    return replace(
        settings,
        storage=replace(storage, access_key=access, secret_key=secret),
        spark=replace(spark, auth_secret=auth),
    )
