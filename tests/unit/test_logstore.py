"""The log store choice: config validation, the Spark conf per mode, the two-writer refusal, the jar's name."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from streaming.cli import main as iotlake
from streaming.core import logstore
from streaming.core.config import Settings, load_settings
from streaming.core.errors import ConfigError
from streaming.core.session import session_conf

pytestmark = pytest.mark.unit

KEYS = {"IOTLAKE_STORAGE__ACCESS_KEY": "k", "IOTLAKE_STORAGE__SECRET_KEY": "s"}


def _settings(**env: str) -> Settings:
    return load_settings(env={**KEYS, **env})


def _with_sidecar(settings: Settings, enabled: bool) -> Settings:
    return replace(settings, maintenance=replace(settings.maintenance, enabled=enabled))


def test_default_is_put_if_absent_and_single_driver_is_accepted() -> None:
    assert _settings().storage.log_store == "put_if_absent"
    assert _settings(IOTLAKE_STORAGE__LOG_STORE="single_driver").storage.log_store == "single_driver"


def test_an_unknown_log_store_names_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"storage\.log_store.*'put_if_absent', 'single_driver'.*'dynamodb'"):
        _settings(IOTLAKE_STORAGE__LOG_STORE="dynamodb")


def test_put_if_absent_on_s3a_loads_the_jar_and_selects_the_class_for_s3a_and_s3(tmp_path: Path) -> None:
    jar = tmp_path / "iotlake-logstore-x.jar"
    conf = session_conf(_settings(), log_store_jar=jar)
    assert conf["spark.delta.logStore.s3a.impl"] == "io.iotlake.storage.PutIfAbsentLogStore"
    assert conf["spark.delta.logStore.s3.impl"] == "io.iotlake.storage.PutIfAbsentLogStore"
    assert conf["spark.jars"] == str(jar)


def test_the_log_store_jar_is_added_to_jars_from_config(tmp_path: Path) -> None:
    jar = tmp_path / "iotlake-logstore-x.jar"
    conf = session_conf(_settings(**{"IOTLAKE_SPARK__CONF__spark.jars": "/opt/a.jar,/opt/b.jar"}), log_store_jar=jar)
    assert conf["spark.jars"] == f"/opt/a.jar,/opt/b.jar,{jar}"


@pytest.mark.parametrize(
    "env",
    [
        {"IOTLAKE_STORAGE__LOG_STORE": "single_driver"},
        {"IOTLAKE_STORAGE__BASE_URI": "file:/tmp/lake"},  # Delta's own store for local files
    ],
    ids=["single_driver", "local-files"],
)
def test_delta_default_store_gets_no_log_store_conf(env: dict[str, str]) -> None:
    conf = session_conf(_settings(**env))
    assert not any(k.startswith("spark.delta.logStore") for k in conf)
    assert "spark.jars" not in conf
    assert not logstore.needs_jar(_settings(**env))


@pytest.mark.parametrize(
    ("log_store", "base_uri", "role", "sidecar", "refused"),
    [
        ("single_driver", "s3a://b/lake", "maintain", False, True),
        ("single_driver", "s3a://b/lake", "maintain", True, True),
        ("single_driver", "s3://b/lake", "maintain", True, True),
        ("single_driver", "s3a://b/lake", "ingest", True, True),
        ("single_driver", "s3a://b/lake", "ingest", False, False),
        ("put_if_absent", "s3a://b/lake", "maintain", True, False),
        ("put_if_absent", "s3a://b/lake", "ingest", True, False),
        ("single_driver", "file:/tmp/lake", "maintain", True, False),
        ("single_driver", "s3a://b/lake", "ops", False, True),
        ("put_if_absent", "s3a://b/lake", "ops", False, False),
    ],
)
def test_refusal_matrix(log_store: str, base_uri: str, role: str, sidecar: bool, refused: bool) -> None:
    s = _settings(IOTLAKE_STORAGE__LOG_STORE=log_store, IOTLAKE_STORAGE__BASE_URI=base_uri)
    target = _with_sidecar(s, sidecar)
    if refused:
        with pytest.raises(ConfigError, match=r"single_driver.*put_if_absent"):
            logstore.check_writers_safe(target, role)
    else:
        logstore.check_writers_safe(target, role)


def test_with_the_sidecar_disabled_ingest_is_the_only_writer() -> None:
    s = _settings(IOTLAKE_STORAGE__LOG_STORE="single_driver", IOTLAKE_MAINTENANCE__ENABLED="false")
    logstore.check_writers_safe(s, "ingest")
    with pytest.raises(ConfigError, match="sidecar runs beside the stream"):
        logstore.check_writers_safe(s, "maintain")


def test_an_unknown_role_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="role"):
        logstore.check_writers_safe(_settings(), "compact")


def test_jar_name_is_stable_and_changes_with_the_source_or_the_versions(tmp_path: Path) -> None:
    a = logstore.jar_name("class A {}", "4.4.0")
    assert a == logstore.jar_name("class A {}", "4.4.0")
    assert a.startswith("iotlake-logstore-") and a.endswith(".jar")
    assert a != logstore.jar_name("class A { }", "4.4.0")
    assert a != logstore.jar_name("class A {}", "4.4.1")
    assert a != logstore.jar_name("class A {}", "4.4.0", hadoop="3.5.1")
    assert logstore.jar_path("class A {}", tmp_path) == tmp_path / logstore.jar_name("class A {}", "4.4.0")


def test_jar_lives_in_the_download_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("IOTLAKE_CACHE", str(tmp_path))
    assert logstore.jar_path().parent == tmp_path / "jars"


def test_missing_javac_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(Exception, match="openjdk-17-jdk-headless") as info:
        logstore.find_javac()
    assert info.value.exit_code == 2  # type: ignore[attr-defined]


def test_build_jar_compiles_the_committed_source(tmp_path: Path) -> None:
    """Needs javac and the resolved Ivy jars (`make install`), no services."""
    target = tmp_path / "iotlake-logstore-test.jar"
    settings = _settings()
    assert logstore.build_jar(settings, target=target) == target
    import zipfile

    with zipfile.ZipFile(target) as jar:
        assert "io/iotlake/storage/PutIfAbsentLogStore.class" in jar.namelist()


def test_iotlake_ingest_refuses_single_driver_with_the_sidecar_enabled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IOTLAKE_STORAGE__LOG_STORE", "single_driver")
    monkeypatch.setenv("IOTLAKE_MAINTENANCE__ENABLED", "true")
    assert iotlake(["ingest"]) == 2
    err = capsys.readouterr().err
    assert "Unsafe configuration" in err and "storage.log_store: put_if_absent" in err
