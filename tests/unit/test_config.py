"""Config loading: YAML defaults, environment overrides, secrets, and clear errors for bad values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from streaming import cli
from streaming.core.config import load_settings, parse_duration
from streaming.core.errors import ConfigError

pytestmark = pytest.mark.unit


def test_defaults_load_from_committed_yaml() -> None:
    s = load_settings(env={})
    assert s.kafka.topic == "sensor-readings"
    assert s.kafka.partitions == 6
    assert s.storage.bucket == "iotlake"
    assert s.tables.readings.partition_by == ("event_date",)
    assert s.validation.ranges["air_temperature_c"].max == 70


def test_settings_on_local_files_move_only_the_tables(tmp_path: Path) -> None:
    s = load_settings(env={"IOTLAKE_KAFKA__TOPIC": "t1"})
    local = s.on_local_files(tmp_path / "lake")
    assert s.storage.is_s3 and not local.storage.is_s3
    assert local.storage.table_uri("readings").startswith(f"file:{tmp_path / 'lake'}")
    assert local.kafka == s.kafka and local.spark == s.spark and local.tables == s.tables
    assert local.storage.endpoint == s.storage.endpoint and local.storage.log_store == s.storage.log_store


def test_env_overrides_nested_keys_and_parse_scalars() -> None:
    s = load_settings(
        env={
            "IOTLAKE_KAFKA__PARTITIONS": "3",
            "IOTLAKE_KAFKA__TOPIC": "t1",
            "IOTLAKE_VALIDATION__SCHEMA_VERSIONS": "[1, 2]",
            "IOTLAKE_SPARK__CONF__spark.sql.shuffle.partitions": "8",
        }
    )
    assert s.kafka.partitions == 3
    assert s.kafka.topic == "t1"
    assert s.validation.schema_versions == (1, 2)
    assert s.spark.conf["spark.sql.shuffle.partitions"] == "8"


def test_secrets_come_from_env_or_the_generated_file(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets.env"
    secrets.write_text("IOTLAKE_WRITER_ACCESS_KEY=fromfile\nIOTLAKE_WRITER_SECRET_KEY=s3cret\n")
    s = load_settings(env={"IOTLAKE_STORAGE__SECRETS_FILE": str(secrets)})
    assert (s.storage.access_key, s.storage.secret_key) == ("fromfile", "s3cret")
    s = load_settings(
        env={
            "IOTLAKE_STORAGE__SECRETS_FILE": str(secrets),
            "IOTLAKE_STORAGE__ACCESS_KEY": "fromenv",
            "IOTLAKE_STORAGE__SECRET_KEY": "x",
        }
    )
    assert s.storage.access_key == "fromenv"


def test_masked_config_hides_secrets(tmp_path: Path) -> None:
    s = load_settings(env={"IOTLAKE_STORAGE__ACCESS_KEY": "AKIA-SECRET", "IOTLAKE_STORAGE__SECRET_KEY": "TOPSECRET"})
    text = s.to_json()
    assert "TOPSECRET" not in text and "AKIA-SECRET" not in text
    assert s.masked()["storage"]["secret_key"] == "***"


JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="JAAS-PW";'
SECURED_ENV = {
    # The YAML flow-mapping form of kafka.options, and the nested form of spark.conf.
    "IOTLAKE_KAFKA__OPTIONS": (
        "{kafka.security.protocol: SASL_SSL, kafka.sasl.mechanism: PLAIN, "
        f"kafka.sasl.jaas.config: '{JAAS}', kafka.ssl.truststore.location: /etc/kafka/ca.jks, "
        "kafka.ssl.truststore.password: TRUST-PW, kafka.SSL.Key.Password: KEY-PW}"
    ),
    "IOTLAKE_SPARK__CONF__spark.hadoop.fs.s3a.secret.key": "S3A-SECRET",
    "IOTLAKE_SPARK__CONF__some.Token": "SOME-TOKEN",
    "IOTLAKE_SPARK__CONF__spark.hadoop.fs.azure.sas.fixed.credential": "AZ-CRED",
    "IOTLAKE_STORAGE__SECRET_KEY": "STORAGE-SECRET",
}
SECRET_VALUES = ("JAAS-PW", "TRUST-PW", "KEY-PW", "S3A-SECRET", "SOME-TOKEN", "AZ-CRED", "STORAGE-SECRET")


def test_masked_config_hides_secret_looking_kafka_options_and_spark_conf() -> None:
    s = load_settings(env=SECURED_ENV)
    assert s.kafka.options["kafka.sasl.jaas.config"] == JAAS  # the real value is what the clients get
    masked = s.masked()
    options, conf = masked["kafka"]["options"], masked["spark"]["conf"]
    for key in ("kafka.sasl.jaas.config", "kafka.ssl.truststore.password", "kafka.SSL.Key.Password"):
        assert options[key] == "***", key
    for key in ("spark.hadoop.fs.s3a.secret.key", "some.Token", "spark.hadoop.fs.azure.sas.fixed.credential"):
        assert conf[key] == "***", key
    # What is not secret stays readable.
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.ssl.truststore.location"] == "/etc/kafka/ca.jks"
    assert conf["spark.sql.shuffle.partitions"] == "4"
    text = s.to_json()
    assert json.loads(text)["kafka"]["options"]["kafka.sasl.jaas.config"] == "***"
    assert not [v for v in SECRET_VALUES if v in text]


@pytest.mark.parametrize("args", [["config"], ["config", "--json"]])
def test_config_command_masks_every_secret_in_yaml_and_json(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in SECURED_ENV.items():
        monkeypatch.setenv(name, value)
    assert cli.main(args) == 0
    out, err = capsys.readouterr()
    shown = json.loads(out) if "--json" in args else yaml.safe_load(out)
    assert shown["kafka"]["options"]["kafka.sasl.jaas.config"] == "***"
    assert shown["spark"]["conf"]["some.Token"] == "***"
    assert not [v for v in SECRET_VALUES if v in out + err]


def test_kafka_options_and_spark_conf_from_nested_env_keep_their_text() -> None:
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p #1: x";'
    s = load_settings(
        env={
            "IOTLAKE_KAFKA__OPTIONS__kafka.sasl.jaas.config": jaas,
            "IOTLAKE_KAFKA__OPTIONS__kafka.security.protocol": "SASL_PLAINTEXT",
            "IOTLAKE_SPARK__CONF__spark.ui.enabled": "false",
        }
    )
    assert s.kafka.options == {"kafka.sasl.jaas.config": jaas, "kafka.security.protocol": "SASL_PLAINTEXT"}
    assert s.spark.conf["spark.ui.enabled"] == "false"


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"IOTLAKE_KAFKA__PARTITIONS": "many"}, "kafka.partitions"),
        ({"IOTLAKE_KAFKA__STARTING_OFFSETS": "middle"}, "kafka.starting_offsets"),
        ({"IOTLAKE_KAFKA__BOGUS": "1"}, "kafka.bogus"),
        ({"IOTLAKE_VALIDATION__ACTIONS__OUT_OF_RANGE": "explode"}, "validation.actions.out_of_range"),
        ({"IOTLAKE_VALIDATION__ACTIONS__MISSING_FIELD": "warn"}, "validation.actions.missing_field"),
        ({"IOTLAKE_VALIDATION__ACTIONS__NO_SUCH_RULE": "drop"}, "unknown rule"),
        ({"IOTLAKE_VALIDATION__MAX_LATENESS": "forever"}, "validation.max_lateness"),
        ({"IOTLAKE_INGEST__EXACTLY_ONCE": "false"}, "ingest.exactly_once"),  # a test hook now: env only
        ({"IOTLAKE_INGEST__DEVICE_STATE_INTERVAL": "-1 seconds"}, "ingest.device_state_interval"),
        ({"IOTLAKE_INGEST__DEVICE_STATE_INTERVAL": "often"}, "ingest.device_state_interval"),
        ({"IOTLAKE_STORAGE__BASE_URI": "bucket/path"}, "storage.base_uri"),
        ({"IOTLAKE_VALIDATION__REQUIRED": "[device_id]"}, "validation.required"),
    ],
)
def test_bad_values_name_the_key(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env=env)
    assert needle in str(info.value)


def test_missing_file_and_bad_yaml_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.yaml", env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("kafka: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(bad, env={})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5 minutes", 300),
        ("7 days", 604800),
        ("interval 30 days", 2592000),
        ("250 ms", 0.25),
        (12, 12),
        ("2h", 7200),
    ],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text, "k") == seconds


def test_no_secret_shows_in_the_repr_of_the_settings_or_a_section() -> None:
    """A log line or a traceback that prints the settings (or one section) must not leak a credential."""
    s = load_settings(
        env={**SECURED_ENV, "IOTLAKE_STORAGE__ACCESS_KEY": "ACCESS-KEY", "IOTLAKE_SPARK__AUTH_SECRET": "AUTH-VALUE"}
    )
    assert s.storage.secret_key == "STORAGE-SECRET" and s.spark.auth_secret == "AUTH-VALUE"  # loaded, not dropped
    for text in (repr(s), str(s), repr(s.storage), repr(s.kafka), repr(s.spark)):
        leaked = [v for v in (*SECRET_VALUES, "ACCESS-KEY", "AUTH-VALUE") if v in text]
        assert leaked == [], f"{leaked} in {text[:200]}"
