"""The Spark Kafka source's Java client options (`kafka.*`) as librdkafka settings, for the Python checks.

Spark's source takes the Java client's names (`kafka.sasl.jaas.config`, `kafka.ssl.truststore.location`, ...);
preflight and status talk to Kafka through librdkafka (confluent-kafka), which names things differently and
refuses the Java ones. What can be translated is; options that only tune the Java consumer are left out (a
metadata request doesn't need them); security options librdkafka can't express (a JKS truststore, Kerberos,
a custom callback handler, ...) raise UnmappableKafkaOptions, and the caller skips its check: Spark's own
client connects with them. Credentials are never sent without full TLS verification, and no translation ever
turns verification off.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from streaming.core.errors import ConfigError

SPARK_PREFIX = "kafka."
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# Login modules whose options are just a username and a password (what librdkafka's PLAIN and SCRAM take).
LOGIN_MODULES = (
    "org.apache.kafka.common.security.plain.PlainLoginModule",
    "org.apache.kafka.common.security.scram.ScramLoginModule",
)
JAAS_FLAGS = ("required", "requisite", "sufficient", "optional")
# Same name and meaning in both clients; harmless for a metadata request.
PASSTHROUGH = ("client.id", "client.dns.lookup")
# Java classes can change what is sent or trusted: nothing in librdkafka stands for them.
JAVA_CLASSES = (
    "sasl.client.callback.handler.class",
    "sasl.login.callback.handler.class",
    "sasl.login.class",
    "ssl.engine.factory.class",
)


class UnmappableKafkaOptions(Exception):
    """Security options of the Java client that librdkafka can't express; names the keys, never the values."""

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = tuple(reasons)
        super().__init__("; ".join(reasons))


@dataclass(frozen=True)
class JaasConfig:
    """One login module of a `sasl.jaas.config` value: `Module flag key=value ...;`."""

    module: str
    flag: str
    options: dict[str, str]


_CLASS_NAME = re.compile(r"[A-Za-z_$][\w$]*(\.[A-Za-z_$][\w$]*)+")
_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "a": "\a", "v": "\v"}


def parse_jaas(text: str) -> JaasConfig:
    """Parse a one-module JAAS config the way Kafka's JaasConfig does (quoted values with backslash escapes).

    Raises ValueError with a reason that never includes an option's value.
    """
    tokens = _jaas_tokens(text)
    if len(tokens) < 3 or tokens[-1] != (";", False):
        raise ValueError("expected `LoginModuleClass required key=\"value\" ...;` ending with ';'")
    (module, _), (flag, _) = tokens[0], tokens[1]
    if flag.lower() not in JAAS_FLAGS:
        raise ValueError(f"the login module's flag must be one of {list(JAAS_FLAGS)}")
    options: dict[str, str] = {}
    rest = tokens[2:-1]
    if (";", False) in rest:
        raise ValueError("only one login module may be given")
    if len(rest) % 3:
        raise ValueError("every option must be key=value")
    for i in range(0, len(rest), 3):
        (key, key_quoted), (eq, eq_quoted), (value, value_quoted) = rest[i : i + 3]
        if key_quoted or key == "=" or (eq, eq_quoted) != ("=", False) or (value == "=" and not value_quoted):
            raise ValueError("every option must be key=value")
        options[key] = value
    return JaasConfig(module, flag.lower(), options)


def _jaas_tokens(text: str) -> list[tuple[str, bool]]:
    """Words, '=' and ';' (quoted: False) and quoted strings (quoted: True)."""
    tokens: list[tuple[str, bool]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c in "=;":
            tokens.append((c, False))
            i += 1
        elif c in "\"'":
            value, i = _quoted(text, i)
            tokens.append((value, True))
        else:
            start = i
            while i < n and not text[i].isspace() and text[i] not in "=;\"'":
                i += 1
            tokens.append((text[start:i], False))
    return tokens


def _quoted(text: str, start: int) -> tuple[str, int]:
    quote, i = text[start], start + 1
    out: list[str] = []
    while i < len(text):
        c = text[i]
        if c == quote:
            return "".join(out), i + 1
        if c == "\\" and i + 1 < len(text):
            i += 1
            out.append(_ESCAPES.get(text[i], text[i]))
        else:
            out.append(c)
        i += 1
    raise ValueError("a quoted value is not closed")


def java_to_librdkafka(bootstrap_servers: str, options: Mapping[str, str]) -> dict[str, str]:
    """librdkafka settings for the Spark source's `kafka.*` options (other source options are ignored).

    Raises UnmappableKafkaOptions when a security option can't be expressed, ConfigError when
    kafka.security.protocol is not one the Java client knows.
    """
    java = {k[len(SPARK_PREFIX) :].lower(): v for k, v in options.items() if k.lower().startswith(SPARK_PREFIX)}
    conf = {"bootstrap.servers": java.get("bootstrap.servers", bootstrap_servers)}
    protocol = java.get("security.protocol", "PLAINTEXT").strip().upper()
    if protocol not in PROTOCOLS:
        raise ConfigError(
            f"kafka.options kafka.security.protocol is {java['security.protocol']!r}; the Kafka client knows "
            f"{list(PROTOCOLS)}. Fix it in kafka.options (IOTLAKE_KAFKA__OPTIONS)."
        )
    if protocol != "PLAINTEXT":
        conf["security.protocol"] = protocol.lower()
    unmappable: list[str] = []
    if protocol.startswith("SASL_"):  # SASL_PLAINTEXT: what the Java client sends in clear text, so does the check
        conf.update(_sasl(java, unmappable))
        if protocol == "SASL_SSL" and java.get("ssl.endpoint.identification.algorithm", "https").strip() == "":
            unmappable.append(
                "kafka.ssl.endpoint.identification.algorithm is empty (no host name check): the check does not "
                "send credentials without full TLS verification"
            )
    if protocol in ("SSL", "SASL_SSL"):
        conf.update(_tls(java, unmappable))
    in_use = ("sasl." if protocol.startswith("SASL_") else "-", "ssl." if protocol.endswith("SSL") else "-")
    unmappable += [f"kafka.{key} is a Java class" for key in JAVA_CLASSES if key in java and key.startswith(in_use)]
    conf.update({key: java[key] for key in PASSTHROUGH if key in java})
    if unmappable:
        raise UnmappableKafkaOptions(unmappable)
    return conf


def _sasl(java: Mapping[str, str], unmappable: list[str]) -> dict[str, str]:
    """sasl.mechanisms, sasl.username and sasl.password from sasl.mechanism and sasl.jaas.config."""
    mechanism = java.get("sasl.mechanism", "GSSAPI").strip().upper()  # the Java client's default is GSSAPI
    if mechanism not in MECHANISMS:
        unmappable.append(f"kafka.sasl.mechanism {mechanism} (the check speaks {', '.join(MECHANISMS)})")
        return {}
    text = java.get("sasl.jaas.config")
    if text is None:
        unmappable.append("kafka.sasl.jaas.config is not set (the JVM's login config file is Java-only)")
        return {}
    try:
        jaas = parse_jaas(text)
    except ValueError as e:
        unmappable.append(f"kafka.sasl.jaas.config can't be read: {e}")
        return {}
    if jaas.module not in LOGIN_MODULES:
        # Named only when it looks like a class name: a garbled value must not end up in a log line.
        module = jaas.module if _CLASS_NAME.fullmatch(jaas.module) else "an unknown login module"
        unmappable.append(f"kafka.sasl.jaas.config uses {module} (the check knows {', '.join(LOGIN_MODULES)})")
        return {}
    if jaas.options.get("tokenauth", "false").lower() == "true":
        unmappable.append("kafka.sasl.jaas.config uses delegation tokens (tokenauth=true)")
        return {}
    missing = [k for k in ("username", "password") if k not in jaas.options]
    if missing:
        unmappable.append(f"kafka.sasl.jaas.config has no {' and no '.join(missing)}")
        return {}
    return {
        "sasl.mechanisms": mechanism,
        "sasl.username": jaas.options["username"],
        "sasl.password": jaas.options["password"],
    }


def _tls(java: Mapping[str, str], unmappable: list[str]) -> dict[str, str]:
    """CA, client certificate and host name check; TLS versions and ciphers keep librdkafka's defaults."""
    conf: dict[str, str] = {}
    trust_type = java.get("ssl.truststore.type", "JKS").strip().upper()
    truststore = (("ssl.truststore.location", "ssl.ca.location"), ("ssl.truststore.certificates", "ssl.ca.pem"))
    for java_key, librdkafka_key in truststore:
        if java_key not in java:
            continue
        if trust_type == "PEM":
            conf[librdkafka_key] = java[java_key]
        else:
            unmappable.append(f"kafka.{java_key} is a {trust_type} truststore (the check reads PEM only)")
    key_type = java.get("ssl.keystore.type", "JKS").strip().upper()
    if "ssl.keystore.location" in java:
        location = java["ssl.keystore.location"]
        if key_type == "PKCS12":
            conf["ssl.keystore.location"] = location
            if "ssl.keystore.password" in java:
                conf["ssl.keystore.password"] = java["ssl.keystore.password"]
        elif key_type == "PEM":
            conf["ssl.certificate.location"] = conf["ssl.key.location"] = location
        else:
            unmappable.append(f"kafka.ssl.keystore.location is a {key_type} keystore (the check reads PKCS12 or PEM)")
    inline = (("ssl.keystore.certificate.chain", "ssl.certificate.pem"), ("ssl.keystore.key", "ssl.key.pem"))
    for java_key, librdkafka_key in inline:
        if java_key in java:
            conf[librdkafka_key] = java[java_key]
    if "ssl.key.password" in java and key_type == "PEM":
        conf["ssl.key.password"] = java["ssl.key.password"]
    if "ssl.endpoint.identification.algorithm" in java:
        algorithm = java["ssl.endpoint.identification.algorithm"].strip().lower()
        if algorithm in ("", "https"):
            conf["ssl.endpoint.identification.algorithm"] = algorithm or "none"
        else:
            unmappable.append(f"kafka.ssl.endpoint.identification.algorithm {algorithm!r} (the check knows https)")
    return conf
