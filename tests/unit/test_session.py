"""The session's launch conf holds no credential: spark-submit puts every builder conf on the JVM's command line."""

from __future__ import annotations

import pytest

from streaming.config import load_settings
from streaming.errors import CredentialsError
from streaming.session import session_conf, split_credentials, storage_credentials

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
