"""The Spark source's Java `kafka.*` options as librdkafka settings for the Python checks (preflight, status)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient

from streaming.core import preflight
from streaming.core.config import KafkaConfig, Settings
from streaming.core.errors import ConfigError, CredentialsError, ServiceUnreachableError
from streaming.pipeline.ingest import source_options

pytestmark = pytest.mark.unit

PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
SERVERS = "127.0.0.1:1"  # nothing listens there: the clients built below never reach a broker


def _settings(options: Mapping[str, str]) -> Settings:
    return Settings(kafka=KafkaConfig(bootstrap_servers=SERVERS, options=dict(options)))


def mapped(options: Mapping[str, str]) -> dict[str, Any]:
    return dict(preflight.kafka_client_conf(_settings(options)))


def librdkafka_accepts(conf: Mapping[str, Any]) -> None:
    """librdkafka refuses unknown or Java-only properties when the client is built."""
    quiet = logging.getLogger("tests.librdkafka")
    quiet.propagate = False
    AdminClient({**conf, "logger": quiet})


def sasl(mechanism: str, jaas: str, protocol: str = "SASL_PLAINTEXT") -> dict[str, str]:
    return {"kafka.security.protocol": protocol, "kafka.sasl.mechanism": mechanism, "kafka.sasl.jaas.config": jaas}


def test_no_options_is_just_the_bootstrap_servers() -> None:
    assert mapped({}) == {"bootstrap.servers": SERVERS}


def test_sasl_plain_becomes_username_and_password() -> None:
    conf = mapped(sasl("PLAIN", f'{PLAIN} required username="alice" password="pa ss";'))
    assert conf == {
        "bootstrap.servers": SERVERS,
        "security.protocol": "sasl_plaintext",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "alice",
        "sasl.password": "pa ss",
    }
    librdkafka_accepts(conf)


def test_scram_over_tls_with_a_pem_truststore() -> None:
    options = {
        **sasl("SCRAM-SHA-512", f'{SCRAM} required username="bob" password="s3cr3t";', "SASL_SSL"),
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/etc/kafka/ca.pem",
        "kafka.ssl.endpoint.identification.algorithm": "https",
    }
    assert mapped(options) == {
        "bootstrap.servers": SERVERS,
        "security.protocol": "sasl_ssl",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "bob",
        "sasl.password": "s3cr3t",
        "ssl.ca.location": "/etc/kafka/ca.pem",
        "ssl.endpoint.identification.algorithm": "https",
    }


@pytest.mark.parametrize(
    ("jaas", "username", "password"),
    [
        (f'{PLAIN} required username="a\\"b" password="c\\\\d;e";', 'a"b', "c\\d;e"),
        (f"{PLAIN} required username='single' password='it is';", "single", "it is"),
        (f"{PLAIN} required username=bare password=Bare_1-x$;", "bare", "Bare_1-x$"),
        (f'  {PLAIN}\n  required\n  password = "p=q"\n  username = "u" ;  ', "u", "p=q"),
        (f'{SCRAM} optional username="s" password="#not a comment";', "s", "#not a comment"),
    ],
)
def test_jaas_values_with_quotes_escapes_and_spacing(jaas: str, username: str, password: str) -> None:
    conf = mapped(sasl("PLAIN", jaas))
    assert (conf["sasl.username"], conf["sasl.password"]) == (username, password)


def test_tls_options_map_to_their_librdkafka_names() -> None:
    conf = mapped(
        {
            "kafka.security.protocol": "ssl",
            "kafka.ssl.truststore.type": "pem",
            "kafka.ssl.truststore.certificates": "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----",
            "kafka.ssl.truststore.password": "not-needed-for-pem",
            "kafka.ssl.keystore.type": "PKCS12",
            "kafka.ssl.keystore.location": "/etc/kafka/client.p12",
            "kafka.ssl.keystore.password": "ks-pass",
            "kafka.ssl.endpoint.identification.algorithm": "",
        }
    )
    assert conf == {
        "bootstrap.servers": SERVERS,
        "security.protocol": "ssl",
        "ssl.ca.pem": "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----",
        "ssl.keystore.location": "/etc/kafka/client.p12",
        "ssl.keystore.password": "ks-pass",
        "ssl.endpoint.identification.algorithm": "none",  # as the Java client was told; no credentials sent
    }


def test_pem_keystores_map_to_certificate_and_key() -> None:
    in_file = mapped(
        {
            "kafka.security.protocol": "SSL",
            "kafka.ssl.keystore.type": "PEM",
            "kafka.ssl.keystore.location": "/etc/kafka/client.pem",
            "kafka.ssl.key.password": "key-pass",
        }
    )
    assert in_file["ssl.certificate.location"] == in_file["ssl.key.location"] == "/etc/kafka/client.pem"
    assert in_file["ssl.key.password"] == "key-pass"
    inline = mapped(
        {
            "kafka.security.protocol": "SSL",
            "kafka.ssl.keystore.type": "PEM",
            "kafka.ssl.keystore.certificate.chain": "CHAIN",
            "kafka.ssl.keystore.key": "KEY",
        }
    )
    assert (inline["ssl.certificate.pem"], inline["ssl.key.pem"]) == ("CHAIN", "KEY")


def test_options_the_check_does_not_need_are_left_out() -> None:
    conf = mapped(
        {
            **sasl("PLAIN", f'{PLAIN} required username="u" password="p";'),
            "kafka.client.id": "iotlake",
            "kafka.max.poll.records": "500",  # Java consumer tuning: librdkafka has no such property
            "kafka.fetch.max.bytes": "1048576",
            "kafka.sasl.login.refresh.window.factor": "0.8",
            "kafka.ssl.truststore.location": "/x.jks",  # ignored by Java too: the protocol is not TLS
            "kafka.enable.ssl.certificate.verification": "false",  # a librdkafka name: never passed through
            "minPartitions": "12",  # a Spark source option, not a Kafka client one
        }
    )
    assert conf == {
        "bootstrap.servers": SERVERS,
        "security.protocol": "sasl_plaintext",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "u",
        "sasl.password": "p",
        "client.id": "iotlake",
    }
    librdkafka_accepts(conf)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (
            {
                **sasl("PLAIN", f'{PLAIN} required username="u" password="SECRET-PW";', "SASL_SSL"),
                "kafka.ssl.truststore.location": "/etc/kafka/truststore.jks",
                "kafka.ssl.truststore.password": "SECRET-TRUST",
            },
            "kafka.ssl.truststore.location",
        ),
        (
            {
                **sasl("PLAIN", f'{PLAIN} required username="u" password="SECRET-PW";', "SASL_SSL"),
                "kafka.ssl.endpoint.identification.algorithm": "",
            },
            "kafka.ssl.endpoint.identification.algorithm",
        ),
        (
            sasl("GSSAPI", 'com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true keyTab="/k";'),
            "kafka.sasl.mechanism",
        ),
        (
            sasl("OAUTHBEARER", "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"),
            "kafka.sasl.mechanism",
        ),
        ({"kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "PLAIN"}, "kafka.sasl.jaas.config"),
        (sasl("PLAIN", f'{PLAIN} username="u" password="SECRET-PW";'), "kafka.sasl.jaas.config"),
        (sasl("PLAIN", f'{PLAIN} required username="u" password="SECRET-PW"'), "kafka.sasl.jaas.config"),
        (sasl("PLAIN", 'SECRET-PW required username="u" password="p";'), "kafka.sasl.jaas.config"),
        (
            sasl("SCRAM-SHA-256", f'{SCRAM} required username="u" password="SECRET-PW" tokenauth="true";'),
            "kafka.sasl.jaas.config",
        ),
        (
            {
                **sasl("PLAIN", f'{PLAIN} required username="u" password="SECRET-PW";'),
                "kafka.sasl.client.callback.handler.class": "com.example.Handler",
            },
            "kafka.sasl.client.callback.handler.class",
        ),
        (
            {
                "kafka.security.protocol": "SSL",
                "kafka.ssl.keystore.location": "/etc/kafka/keystore.jks",
                "kafka.ssl.keystore.password": "SECRET-KS",
            },
            "kafka.ssl.keystore.location",
        ),
    ],
)
def test_what_librdkafka_cannot_express_skips_the_check(options: dict[str, str], named: str) -> None:
    with pytest.raises(preflight.UnmappableKafkaOptions) as info:
        preflight.kafka_client_conf(_settings(options))
    text = str(info.value)
    assert named in text
    assert "SECRET" not in text


def test_an_unknown_security_protocol_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"kafka\.security\.protocol.*SASL_SSL"):
        preflight.kafka_client_conf(_settings({"kafka.security.protocol": "TLS"}))


def test_check_kafka_skips_with_one_clear_log_line_and_no_secret(caplog: pytest.LogCaptureFixture) -> None:
    options = {
        **sasl("PLAIN", f'{PLAIN} required username="u" password="SECRET-PW";', "SASL_SSL"),
        "kafka.ssl.truststore.location": "/etc/kafka/truststore.jks",
        "kafka.ssl.truststore.password": "SECRET-TRUST",
    }
    with caplog.at_level(logging.DEBUG):
        assert preflight.check_kafka(_settings(options)) is None
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert "kafka.ssl.truststore.location" in warnings[0].getMessage()
    assert "Spark" in warnings[0].getMessage()
    assert "SECRET" not in caplog.text


def test_refused_credentials_name_the_option_to_fix() -> None:
    error = preflight.kafka_failure(
        _settings(sasl("PLAIN", f'{PLAIN} required username="u" password="p";')),
        [KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: Authentication failed: Invalid username")],
        "Local: Broker transport failure",
    )
    assert isinstance(error, CredentialsError)
    assert "kafka.sasl.jaas.config" in str(error) and "IOTLAKE_KAFKA__OPTIONS" in str(error)
    assert "Invalid username" in str(error)


def test_a_failed_tls_handshake_names_the_truststore() -> None:
    error = preflight.kafka_failure(
        _settings({"kafka.security.protocol": "SSL"}),
        [KafkaError(KafkaError._SSL, "SSL handshake failed: certificate verify failed")],
        "Local: Broker transport failure",
    )
    assert isinstance(error, ServiceUnreachableError)
    assert "kafka.ssl.truststore.location" in str(error)


def test_a_broker_that_does_not_answer_is_still_explained_as_before() -> None:
    error = preflight.kafka_failure(_settings({}), [], "Local: Broker transport failure")
    assert isinstance(error, ServiceUnreachableError)
    assert "make up" in str(error) and SERVERS in str(error)


def test_spark_refusing_the_credentials_is_explained() -> None:
    from streaming.pipeline.ingest import _explain

    error = _explain(
        RuntimeError(
            "org.apache.kafka.common.errors.SaslAuthenticationException: Authentication failed: "
            "Invalid username or password\n\tat org.apache.kafka..."
        ),
        _settings(sasl("PLAIN", f'{PLAIN} required username="u" password="p";')),
    )
    assert isinstance(error, CredentialsError)
    assert "kafka.sasl.jaas.config" in str(error) and "Invalid username or password" in str(error)


def test_the_spark_source_fetches_without_kafkas_half_second_wait_unless_the_config_says_otherwise() -> None:
    """At the end of the log, Kafka's default fetch.max.wait.ms (500 ms) delayed every task of a live batch; the
    source's default is 10 ms, and the config's kafka.options still override it and every other option."""
    settings = Settings()
    assert source_options(settings)["kafka.fetch.max.wait.ms"] == "10"
    assert source_options(settings)["subscribe"] == settings.kafka.topic
    mine = {"kafka.fetch.max.wait.ms": "250", "kafka.security.protocol": "SSL", "includeHeaders": "true"}
    options = source_options(Settings(kafka=KafkaConfig(options=mine)))
    assert {k: options[k] for k in mine} == mine
