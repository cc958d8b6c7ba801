"""Typed, frozen configuration: YAML file, then environment overrides, validated once at start-up."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from streaming.core.errors import ConfigError

ENV_PREFIX = "IOTLAKE_"
ENV_NESTING = "__"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
CACHE_ENV = "IOTLAKE_CACHE"
DEFAULT_CACHE = "~/.cache/iotlake"
DEFAULT_CONFIG_PATH = PROJECT_ROOT / "config" / "default.yaml"
SECRET_KEYS = frozenset({"access_key", "secret_key"})
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
# put_if_absent: commits with a conditional PUT, safe with two writer processes (streaming/core/logstore.py).
# single_driver: Delta's S3SingleDriverLogStore, safe with one writer process only.
LOG_STORES = ("put_if_absent", "single_driver")
PREINSTALLED_JARS = ("auto", "true", "false")

_DURATION = re.compile(r"^\s*(?:interval\s+)?(\d+(?:\.\d+)?)\s*([a-z]+)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), 0.001),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
    **dict.fromkeys(("w", "week", "weeks"), 604800.0),
}


def parse_duration(text: str | int | float, key: str) -> float:
    """Seconds in '5 minutes', '7 days', 'interval 30 days', '250 ms' or a bare number of seconds."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    match = _DURATION.match(str(text))
    if not match or match.group(2).lower() not in _UNIT_SECONDS:
        raise ConfigError(
            f"{key}: {text!r} is not a duration. Use a number and a unit, e.g. '30 seconds', "
            "'5 minutes', '2 hours', '7 days'."
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str = "127.0.0.1:9092"
    topic: str = "sensor-readings"
    partitions: int = 6
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int = 250_000
    fail_on_data_loss: bool = True
    options: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold a JAAS password
    # Native stack only: node 1 also offers a SASL_PLAINTEXT (PLAIN) listener on this loopback port (0: none).
    sasl_listener_port: int = 0


@dataclass(frozen=True)
class StorageConfig:
    base_uri: str = "s3a://iotlake/lake"
    endpoint: str = "http://127.0.0.1:9000"
    region: str = "us-east-1"
    path_style_access: bool = True
    ssl_enabled: bool = False
    secrets_file: str = "var/secrets.env"
    access_key: str | None = field(default=None, repr=False)  # never in a log line or a traceback
    secret_key: str | None = field(default=None, repr=False)
    log_store: str = "put_if_absent"

    @property
    def bucket(self) -> str:
        """The bucket named by base_uri (s3a://BUCKET/prefix)."""
        return self.base_uri.split("://", 1)[1].split("/", 1)[0]

    @property
    def is_s3(self) -> bool:
        return self.base_uri.startswith(("s3a://", "s3://"))

    def table_uri(self, name: str) -> str:
        return f"{self.base_uri.rstrip('/')}/{name}"


@dataclass(frozen=True)
class SparkConfig:
    master: str = "local[2]"
    app_name: str = "iotlake-ingest"
    ivy_cache: str = "~/.cache/iotlake/ivy"
    driver_memory: str = "2g"
    conf: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold credentials
    # spark.authenticate's shared secret for a spark:// master (the native cluster's: IOTLAKE_SPARK_AUTH_SECRET in
    # the secrets file). It reaches the driver through a 0600 properties file, never its command line.
    auth_secret: str | None = field(default=None, repr=False)
    # auto | true | false. true: the jars `make install` resolved go on the class path, no Ivy at start (the compose
    # image; on a spark:// cluster the workers hold the same Ivy cache at the same path, so executors load the jars
    # from there instead of copying ~750 MB). false: Ivy resolves them at every start and the application ships them.
    # auto: true for a local master once the jars are resolved (a JVM starts about 11 s sooner), false otherwise.
    preinstalled_jars: str = "auto"


@dataclass(frozen=True)
class SparkClusterConfig:
    """The native Spark standalone cluster (`python -m stack up --cluster`), on loopback."""

    master_port: int = 7077
    webui_port: int = 8080  # the master's web UI and its /json/ status
    worker_cores: int = 1
    worker_memory: str = "2g"  # what the worker offers its executors (spark.executor.memory must fit)


@dataclass(frozen=True)
class IngestConfig:
    checkpoint_location: str = "checkpoints/ingest"
    trigger_interval: str = "1 second"
    device_state_interval: str = "10 seconds"  # device_state is upserted at most this often (0: every batch)
    metrics_port: int = 9108
    metrics_host: str = "127.0.0.1"
    checkpoint_lease_ttl: str = "60 seconds"  # an s3a:// checkpoint's lock: a dead job's lease expires after this
    warm_up: bool = True  # a synthetic batch into scratch tables before the (continuous) query starts

    @property
    def checkpoint_uri(self) -> str:
        """The checkpoint as Spark and Hadoop take it: a URI as given, a local path resolved from the project root."""
        location = self.checkpoint_location
        return location if "://" in location else str(resolve_path(location))

    @property
    def checkpoint_lease_ttl_s(self) -> float:
        return parse_duration(self.checkpoint_lease_ttl, "ingest.checkpoint_lease_ttl")

    @property
    def device_state_interval_s(self) -> float:
        return parse_duration(self.device_state_interval, "ingest.device_state_interval")

    @property
    def trigger_interval_s(self) -> float:
        return parse_duration(self.trigger_interval, "ingest.trigger_interval")


@dataclass(frozen=True)
class TableConfig:
    """One table's name and layout: partitions + Z-ORDER columns, or liquid clustering (`cluster_by`)."""

    name: str
    partition_by: tuple[str, ...] = ()
    zorder_by: tuple[str, ...] = ()
    cluster_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class TablesConfig:
    readings: TableConfig = TableConfig("readings", ("event_date",), ("device_id",))
    device_state: TableConfig = TableConfig("device_state")
    quarantine: TableConfig = TableConfig("quarantine", ("ingest_date",))
    log_retention: str = "interval 30 days"
    deleted_file_retention: str = "interval 7 days"


@dataclass(frozen=True)
class MaintenanceConfig:
    """The sidecar (`iotlake maintain`): when to compact and vacuum, and how to back off on conflicts."""

    enabled: bool = True
    interval: str = "5 minutes"
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9109
    small_file_mb: float = 32.0
    target_file_size_mb: float = 128.0
    min_small_files: int = 10
    min_small_file_ratio: float = 0.5
    open_partition_min_small_files: int = 200
    close_after: str = "1 hour"
    vacuum_interval: str = "1 day"
    retry_backoff: str = "30 seconds"
    max_backoff: str = "30 minutes"
    # The sidecar's (and `iotlake optimize`/`vacuum`'s) OS scheduling niceness, JVM included: 0..19, 0 = the
    # stream's. On a shared machine a compaction then gets the CPU the stream leaves, not the stream's share.
    niceness: int = 10

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


@dataclass(frozen=True)
class Range:
    min: float
    max: float


@dataclass(frozen=True)
class ValidationConfig:
    schema_versions: tuple[int, ...] = (1,)
    required: tuple[str, ...] = ("event_id", "device_id", "parcel_id", "seq", "event_time", "schema_version")
    ranges: Mapping[str, Range] = field(default_factory=dict)
    max_future_skew: str = "5 minutes"
    max_lateness: str = "7 days"
    max_message_bytes: int = 65536
    actions: Mapping[str, str] = field(default_factory=dict)

    @property
    def max_future_skew_s(self) -> float:
        return parse_duration(self.max_future_skew, "validation.max_future_skew")

    @property
    def max_lateness_s(self) -> float:
        return parse_duration(self.max_lateness, "validation.max_lateness")


@dataclass(frozen=True)
class SchemaEvolutionConfig:
    add_new_fields: bool = False


@dataclass(frozen=True)
class MonitoringConfig:
    prometheus_host: str = "127.0.0.1"
    prometheus_port: int = 9090
    scrape_interval: str = "5 seconds"

    @property
    def scrape_interval_s(self) -> float:
        return parse_duration(self.scrape_interval, "monitoring.scrape_interval")


@dataclass(frozen=True)
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
        data = _plain(self)
        for key in SECRET_KEYS:
            if data["storage"].get(key):
                data["storage"][key] = "***"
        if data["spark"].get("auth_secret"):
            data["spark"]["auth_secret"] = "***"
        for section, name in OPTION_MAPPINGS:
            values = data[section][name]
            data[section][name] = {k: "***" if v and is_secret_key(k) else v for k, v in values.items()}
        return data

    def to_json(self) -> str:
        return json.dumps(self.masked(), indent=2, sort_keys=True)

    def on_local_files(self, root: str | Path) -> Settings:
        """The same settings with the tables under a local folder (`file:<root>`): no object store, no keys."""
        return replace(self, storage=replace(self.storage, base_uri=f"file:{root}"))


def _plain(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return {k: _plain(v) for k, v in asdict(obj).items()}
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple | list):
        return [_plain(v) for v in obj]
    return obj


def load_settings(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Read the YAML file (default: config/default.yaml), apply IOTLAKE_* overrides, validate."""
    env = os.environ if env is None else env
    config_path = Path(path or env.get("IOTLAKE_CONFIG") or DEFAULT_CONFIG_PATH)
    try:
        raw = yaml.safe_load(config_path.read_text()) or {}
    except FileNotFoundError as e:
        raise ConfigError(
            f"Config file {config_path} does not exist. Pass --config PATH or set IOTLAKE_CONFIG; "
            f"the committed default is {DEFAULT_CONFIG_PATH}."
        ) from e
    except yaml.YAMLError as e:
        raise ConfigError(f"Config file {config_path} is not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"Config file {config_path} must hold a mapping of sections, not {type(raw).__name__}.")
    _apply_env_overrides(raw, env)
    settings = _build(raw, str(config_path))
    settings = _with_secrets(settings)
    _validate(settings)
    return settings


def _apply_env_overrides(raw: dict[str, Any], env: Mapping[str, str]) -> None:
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or ENV_NESTING not in name:
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX) :].split(ENV_NESTING)]
        node = raw
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{name}: '{part}' is a value, not a section; it can't hold '{path[-1]}'.")
            node = child
        leaf = path[-1]
        # Spark conf and Kafka option keys keep their dots and case, and their values stay text (a JAAS config
        # or a password is not YAML): IOTLAKE_SPARK__CONF__spark.sql.shuffle.partitions=4,
        # IOTLAKE_KAFKA__OPTIONS__kafka.sasl.jaas.config='... password="...";'
        if tuple(path[:2]) in OPTION_MAPPINGS and len(path) == 3:
            node[name.split(ENV_NESTING)[-1]] = value
            continue
        node[leaf] = _parse_scalar(value) if leaf not in SECRET_KEYS else value


def _parse_scalar(value: str) -> Any:
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


_SECTIONS: dict[str, type] = {
    "kafka": KafkaConfig,
    "storage": StorageConfig,
    "spark": SparkConfig,
    "spark_cluster": SparkClusterConfig,
    "ingest": IngestConfig,
    "validation": ValidationConfig,
    "schema_evolution": SchemaEvolutionConfig,
    "maintenance": MaintenanceConfig,
    "monitoring": MonitoringConfig,
}


def _build(raw: dict[str, Any], source: str) -> Settings:
    unknown = set(raw) - set(_SECTIONS) - {"tables"}
    if unknown:
        raise ConfigError(f"Unknown config section(s) {sorted(unknown)}. Allowed: {sorted([*_SECTIONS, 'tables'])}.")
    built: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        built[name] = _section(cls, raw.get(name) or {}, name)
    built["tables"] = _tables(raw.get("tables") or {})
    return Settings(**built, source=source)


def _section(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix} must be a mapping, got {data!r}.")
    known = {f.name: f for f in fields(cls)}
    unknown = set(data) - set(known)
    if unknown:
        raise ConfigError(f"Unknown key(s) {sorted(f'{prefix}.{k}' for k in unknown)}. Allowed: {sorted(known)}.")
    values: dict[str, Any] = {}
    for key, value in data.items():
        values[key] = _coerce(cls, key, value, f"{prefix}.{key}")
    return cls(**values)


def _coerce(cls: type, key: str, value: Any, where: str) -> Any:
    default = {f.name: f.default for f in fields(cls)}[key]
    if key == "ranges":
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must map a field to {{min, max}}, got {value!r}.")
        out = {}
        for name, bounds in value.items():
            if not isinstance(bounds, dict) or set(bounds) != {"min", "max"}:
                raise ConfigError(f"{where}.{name} must be {{min: NUMBER, max: NUMBER}}, got {bounds!r}.")
            lo, hi = bounds["min"], bounds["max"]
            if not all(isinstance(b, int | float) and not isinstance(b, bool) for b in (lo, hi)) or lo > hi:
                raise ConfigError(f"{where}.{name}: min and max must be numbers with min <= max, got {bounds!r}.")
            out[str(name)] = Range(float(lo), float(hi))
        return out
    if key in ("conf", "options", "actions"):
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}.")
        return {str(k): str(v) for k, v in value.items()}
    if key in ("required", "schema_versions"):
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, got {value!r}.")
        return tuple(value)
    if value is None:
        return None
    if key == "preinstalled_jars":
        return str(value).lower()  # YAML reads true/false as booleans, auto as text
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}.")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be a whole number, got {value!r}.")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} must be a number, got {value!r}.")
        return float(value)
    if isinstance(default, str) or default is None:
        return str(value)
    return value


def _tables(data: Any) -> TablesConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"tables must be a mapping, got {data!r}.")
    base = TablesConfig()
    allowed = {"readings", "device_state", "quarantine", "log_retention", "deleted_file_retention"}
    unknown = set(data) - allowed
    if unknown:
        raise ConfigError(f"Unknown key(s) {sorted(f'tables.{k}' for k in unknown)}. Allowed: {sorted(allowed)}.")
    values: dict[str, Any] = {}
    for key in ("readings", "device_state", "quarantine"):
        current: TableConfig = getattr(base, key)
        spec = data.get(key) or {}
        layout_keys = ("partition_by", "zorder_by", "cluster_by")
        if not isinstance(spec, dict) or set(spec) - {"name", *layout_keys}:
            raise ConfigError(f"tables.{key} takes 'name', 'partition_by', 'zorder_by' and 'cluster_by', got {spec!r}.")
        name = str(spec.get("name", current.name))
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConfigError(f"tables.{key}.name {name!r} must be letters, digits and underscores.")
        layout = {k: tuple(spec.get(k, getattr(current, k)) or ()) for k in layout_keys}
        if layout["cluster_by"] and (layout["partition_by"] or layout["zorder_by"]):
            raise ConfigError(
                f"tables.{key}: cluster_by (liquid clustering) can't be combined with partition_by or zorder_by. "
                "Set partition_by: [] and zorder_by: [] to cluster, or drop cluster_by."
            )
        values[key] = TableConfig(name, **layout)
    for key in ("log_retention", "deleted_file_retention"):
        values[key] = str(data.get(key, getattr(base, key)))
    return TablesConfig(**values)


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


def default_cache(env: Mapping[str, str] | None = None) -> Path:
    """The download cache, outside the clone: $IOTLAKE_CACHE or ~/.cache/iotlake."""
    env = os.environ if env is None else env
    return Path(env.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


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
    secrets = read_secrets_file(resolve_path(storage.secrets_file))
    access = storage.access_key or secrets.get("IOTLAKE_WRITER_ACCESS_KEY")
    secret = storage.secret_key or secrets.get("IOTLAKE_WRITER_SECRET_KEY")
    auth = spark.auth_secret or (secrets.get("IOTLAKE_SPARK_AUTH_SECRET") if wants_auth else None)
    return replace(
        settings,
        storage=replace(storage, access_key=access, secret_key=secret),
        spark=replace(spark, auth_secret=auth),
    )


def _validate_maintenance(m: MaintenanceConfig) -> None:
    for key in ("interval", "close_after", "vacuum_interval", "retry_backoff", "max_backoff"):
        parse_duration(getattr(m, key), f"maintenance.{key}")
    if m.interval_s <= 0 or m.retry_backoff_s <= 0 or m.max_backoff_s < m.retry_backoff_s:
        raise ConfigError("maintenance.interval and retry_backoff must be > 0, and max_backoff >= retry_backoff.")
    if not 0 <= m.metrics_port <= 65535:
        raise ConfigError(f"maintenance.metrics_port must be 0..65535, got {m.metrics_port}.")
    if not 0 <= m.niceness <= 19:
        raise ConfigError(
            f"maintenance.niceness must be 0..19 (0: the stream's priority, 19: the lowest), got {m.niceness}."
        )
    if not 0 < m.small_file_mb < m.target_file_size_mb:
        raise ConfigError(
            f"maintenance.small_file_mb ({m.small_file_mb}) must be > 0 and below target_file_size_mb "
            f"({m.target_file_size_mb}): a file is small when it is well under the size compaction aims for."
        )
    if m.min_small_files < 2 or m.open_partition_min_small_files < m.min_small_files:
        raise ConfigError(
            "maintenance.min_small_files must be >= 2 (one file can't be compacted), and "
            "open_partition_min_small_files >= min_small_files (the open partition has the higher bar)."
        )
    if not 0 < m.min_small_file_ratio <= 1:
        raise ConfigError(f"maintenance.min_small_file_ratio must be in (0, 1], got {m.min_small_file_ratio}.")


def _validate(s: Settings) -> None:
    if not s.kafka.bootstrap_servers.strip():
        raise ConfigError("kafka.bootstrap_servers is empty. Set it to host:port[,host:port].")
    if s.kafka.partitions < 1:
        raise ConfigError(f"kafka.partitions must be >= 1, got {s.kafka.partitions}.")
    if s.kafka.starting_offsets not in ("earliest", "latest"):
        raise ConfigError(f"kafka.starting_offsets must be 'earliest' or 'latest', got {s.kafka.starting_offsets!r}.")
    if s.kafka.max_offsets_per_trigger < 1:
        raise ConfigError("kafka.max_offsets_per_trigger must be >= 1.")
    if not 0 <= s.kafka.sasl_listener_port <= 65535:
        raise ConfigError(
            f"kafka.sasl_listener_port must be 0..65535 (0: the native stack offers no SASL listener), "
            f"got {s.kafka.sasl_listener_port}."
        )
    if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:/", s.storage.base_uri):
        raise ConfigError(
            f"storage.base_uri {s.storage.base_uri!r} needs a scheme, e.g. s3a://BUCKET/prefix or file:/path."
        )
    if s.storage.log_store not in LOG_STORES:
        raise ConfigError(
            f"storage.log_store must be one of {list(LOG_STORES)}, got {s.storage.log_store!r}. put_if_absent "
            "is safe with two writer processes; single_driver only with one."
        )
    if s.spark.preinstalled_jars not in PREINSTALLED_JARS:
        raise ConfigError(
            f"spark.preinstalled_jars must be one of {list(PREINSTALLED_JARS)}, got {s.spark.preinstalled_jars!r}."
        )
    parse_duration(s.ingest.trigger_interval, "ingest.trigger_interval")
    if s.ingest.device_state_interval_s < 0:
        raise ConfigError(
            f"ingest.device_state_interval must be 0 (every batch) or more, got {s.ingest.device_state_interval!r}."
        )
    if s.ingest.checkpoint_lease_ttl_s < 10:
        raise ConfigError(
            f"ingest.checkpoint_lease_ttl must be at least 10 seconds (renewed every third of it), "
            f"got {s.ingest.checkpoint_lease_ttl!r}."
        )
    for key in ("log_retention", "deleted_file_retention"):
        parse_duration(getattr(s.tables, key), f"tables.{key}")
    if not 0 <= s.ingest.metrics_port <= 65535:
        raise ConfigError(f"ingest.metrics_port must be 0..65535, got {s.ingest.metrics_port}.")
    _validate_maintenance(s.maintenance)
    for key in ("master_port", "webui_port"):
        port = getattr(s.spark_cluster, key)
        if not 1 <= port <= 65535:
            raise ConfigError(f"spark_cluster.{key} must be 1..65535, got {port}.")
    if s.spark_cluster.master_port == s.spark_cluster.webui_port:
        raise ConfigError("spark_cluster.master_port and spark_cluster.webui_port must differ.")
    if s.spark_cluster.worker_cores < 1:
        raise ConfigError(f"spark_cluster.worker_cores must be >= 1, got {s.spark_cluster.worker_cores}.")
    if not re.fullmatch(r"[1-9][0-9]*[mg]", s.spark_cluster.worker_memory):
        raise ConfigError(
            f"spark_cluster.worker_memory {s.spark_cluster.worker_memory!r} must be a size like 2g or 1536m."
        )
    if not 1 <= s.monitoring.prometheus_port <= 65535:
        raise ConfigError(f"monitoring.prometheus_port must be 1..65535, got {s.monitoring.prometheus_port}.")
    if not 1 <= s.monitoring.scrape_interval_s <= 300 or s.monitoring.scrape_interval_s != int(
        s.monitoring.scrape_interval_s
    ):
        raise ConfigError(
            f"monitoring.scrape_interval must be whole seconds between 1 second and 5 minutes, "
            f"got {s.monitoring.scrape_interval!r}."
        )
    v = s.validation
    if v.max_future_skew_s < 0 or v.max_lateness_s <= 0:
        raise ConfigError("validation.max_future_skew must be >= 0 and validation.max_lateness > 0.")
    if v.max_message_bytes < 1:
        raise ConfigError("validation.max_message_bytes must be >= 1.")
    for rule, action in v.actions.items():
        if rule not in ALL_RULES:
            raise ConfigError(f"validation.actions.{rule}: unknown rule. Known rules: {sorted(ALL_RULES)}.")
        allowed = ACTIONS if rule in VALUE_RULES else tuple(a for a in ACTIONS if a != "warn")
        if action not in allowed:
            raise ConfigError(f"validation.actions.{rule}: {action!r} is not allowed. Choose one of {list(allowed)}.")
    missing_required = {"event_id", "device_id", "event_time", "seq"} - set(v.required)
    if missing_required:
        raise ConfigError(
            f"validation.required must include {sorted(missing_required)}: readings are keyed by event_id and "
            "device_state is ordered by (event_time, seq)."
        )
