"""`iotlake status` and `iotlake ingest` through the test broker's real SASL_PLAINTEXT (PLAIN) listener, with the
Java client's options in kafka.options; a wrong password is one clear error; the password is never shown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stack import StackLayout
from stack import kafka as stack_kafka
from stack import proc as stack_proc
from stack import secrets as sec
from streaming.core.config import Settings
from tests.integration.lake import explain, read_table, run_ingest, simulate

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def sasl_env(test_env: dict[str, str], password: str) -> dict[str, str]:
    """The test env pointed at the SASL listener, the options as a YAML flow mapping in IOTLAKE_KAFKA__OPTIONS."""
    jaas = f"{stack_kafka.PLAIN_LOGIN_MODULE} required username={stack_kafka.jaas_quote(stack_kafka.SASL_USER)} "
    jaas += f"password={stack_kafka.jaas_quote(password)};"
    options = {
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": jaas,
    }
    port = test_env["IOTLAKE_KAFKA__SASL_LISTENER_PORT"]
    return {
        **test_env,
        "IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
        "IOTLAKE_KAFKA__OPTIONS": yaml.safe_dump(options, default_flow_style=True, width=10_000).strip(),
    }


def iotlake(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streaming.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_status_and_ingest_through_the_sasl_listener(
    settings: Settings,
    test_env: dict[str, str],
    stack_secrets: dict[str, str],
    stack_layout: StackLayout,
    tmp_path: Path,
) -> None:
    password = stack_secrets[sec.KAFKA_SASL_PASSWORD]
    summary = simulate(settings, tmp_path, count=300)  # produced through the PLAINTEXT listener
    env = sasl_env(test_env, password)

    before = iotlake(env, "status", "--json")
    assert before.returncode == 0, explain(before)
    assert json.loads(before.stdout)["stream"]["total_lag"] == summary["sent_total"] == 300

    result = run_ingest(env)
    assert result.returncode == 0, explain(result)
    assert "300 message(s) processed" in result.stdout
    assert len(read_table(settings, "readings", stack_secrets)) == summary["valid_distinct"]

    after = iotlake(env, "status", "--json")
    assert after.returncode == 0, explain(after)
    report = json.loads(after.stdout)
    assert report["stream"]["total_lag"] == 0
    assert sum(report["stream"]["committed_offsets"].values()) == 300

    shown = iotlake(env, "config", "--json")
    assert json.loads(shown.stdout)["kafka"]["options"]["kafka.sasl.jaas.config"] == "***"
    for done in (before, result, after, shown):
        assert password not in done.stdout + done.stderr

    # The broker holds the password in its 0600 server.properties only: not in its logs, not on its command line.
    props = stack_layout.kafka_home / "server.properties"
    assert props.stat().st_mode & 0o777 == 0o600
    assert password in props.read_text()
    for log in stack_layout.logs.glob("kafka*"):
        assert password not in log.read_text(errors="replace"), log
    pid = stack_proc.read_pid(stack_kafka.service(stack_layout))
    assert pid is not None and password not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")


def test_a_wrong_password_is_one_clear_error(settings: Settings, test_env: dict[str, str]) -> None:
    env = sasl_env(test_env, "not-the-password")
    for args in (("status", "--json"), ("ingest", "--available-now")):
        done = iotlake(env, *args)
        assert done.returncode == 2, explain(done)
        assert "refused the credentials" in done.stderr, explain(done)
        assert "kafka.sasl.jaas.config" in done.stderr and "IOTLAKE_KAFKA__OPTIONS" in done.stderr
        assert "Traceback" not in done.stderr
        assert "not-the-password" not in done.stdout + done.stderr
