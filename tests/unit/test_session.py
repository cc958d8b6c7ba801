"""The session's launch conf holds no credential: spark-submit puts every builder conf on the JVM's command line."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from streaming.config import load_settings
from streaming.errors import CredentialsError
from streaming.session import (
    SUBMIT_ARGS,
    _auth_properties,
    _submit_args,
    session_conf,
    split_credentials,
    storage_credentials,
)

pytestmark = pytest.mark.unit

ACCESS, SECRET = "AKUNITTESTWRITER0001", "unit-test-writer-secret-0123456789abcdef"
KEYS = {"IOTLAKE_STORAGE__ACCESS_KEY": ACCESS, "IOTLAKE_STORAGE__SECRET_KEY": SECRET}


def test_the_writer_key_is_a_hadoop_credential_not_a_launch_conf() -> None:
    settings = load_settings(env=KEYS)
    assert storage_credentials(settings) == {"fs.s3a.access.key": ACCESS, "fs.s3a.secret.key": SECRET}
    conf = session_conf(settings)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == settings.storage.endpoint
    assert not [k for k, v in conf.items() if ACCESS in v or SECRET in v]
    assert split_credentials(conf) == (conf, {})


def test_credentials_from_config_leave_the_launch_conf_too() -> None:
    env = {
        **KEYS,
        "IOTLAKE_SPARK__CONF__spark.hadoop.fs.s3a.secret.key": "override",
        "IOTLAKE_SPARK__CONF__spark.hadoop.fs.s3a.bucket.other.access.key": "other-key",
        "IOTLAKE_SPARK__CONF__spark.hadoop.fs.s3a.session.token": "token",
    }
    launch, hidden = split_credentials(session_conf(load_settings(env=env)))
    assert hidden == {
        "fs.s3a.secret.key": "override",
        "fs.s3a.bucket.other.access.key": "other-key",
        "fs.s3a.session.token": "token",
    }
    assert not set(launch.values()) & set(hidden.values())
    assert launch["spark.hadoop.fs.s3a.path.style.access"] == "true"


def test_missing_keys_are_a_credentials_error() -> None:
    env = {"IOTLAKE_STORAGE__SECRETS_FILE": "/nonexistent/secrets.env"}
    with pytest.raises(CredentialsError, match="IOTLAKE_STORAGE__SECRET_KEY"):
        storage_credentials(load_settings(env=env))


CLUSTER = {**KEYS, "IOTLAKE_SPARK__MASTER": "spark://127.0.0.1:7077"}


def test_a_cluster_driver_gets_its_auth_secret_from_the_secrets_file_in_a_private_properties_file(
    tmp_path: Path,
) -> None:
    secrets = tmp_path / "secrets.env"
    secrets.write_text("IOTLAKE_SPARK_AUTH_SECRET=cluster-secret-0123456789\n")
    settings = load_settings(env={**CLUSTER, "IOTLAKE_STORAGE__SECRETS_FILE": str(secrets)})
    assert settings.spark.auth_secret == "cluster-secret-0123456789"
    assert settings.masked()["spark"]["auth_secret"] == "***"
    assert not [v for v in session_conf(settings).values() if "cluster-secret" in v]  # never a --conf
    with _auth_properties(settings) as path:
        assert path is not None
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert path.read_text().splitlines() == [
            "spark.authenticate true",
            "spark.authenticate.secret cluster-secret-0123456789",
        ]
    assert not path.exists() and not path.parent.exists()  # gone once the JVM has read it


def test_local_mode_and_a_cluster_without_a_secret_get_no_properties_file(tmp_path: Path) -> None:
    absent = {"IOTLAKE_STORAGE__SECRETS_FILE": str(tmp_path / "absent.env")}
    for env in (KEYS, {**CLUSTER, **absent}, {**KEYS, "IOTLAKE_SPARK__AUTH_SECRET": "only-for-spark-masters"}):
        with _auth_properties(load_settings(env={**env, **absent})) as path:
            assert path is None, env


def test_submit_args_are_set_for_the_launch_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SUBMIT_ARGS, raising=False)
    with _submit_args(["--jars", "a.jar"], tmp_path / "auth.conf"):
        assert os.environ[SUBMIT_ARGS] == f"--jars a.jar --properties-file {tmp_path / 'auth.conf'} pyspark-shell"
    assert SUBMIT_ARGS not in os.environ  # a child process or a later session does not inherit it
    monkeypatch.setenv(SUBMIT_ARGS, "--verbose pyspark-shell")
    with _submit_args([], None):
        assert os.environ[SUBMIT_ARGS] == "pyspark-shell"
    assert os.environ[SUBMIT_ARGS] == "--verbose pyspark-shell"
