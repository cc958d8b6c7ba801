"""The package layout: one direction of imports (core <- pipeline <- lake <- CLIs), checked two ways."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_hold() -> None:
    """`lint-imports` (import-linter) with the contracts in pyproject.toml, as `make lint` runs it."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports")], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.search(r"Contracts: [1-9]\d* kept, 0 broken", done.stdout), done.stdout[-2000:]


def test_the_commands_that_need_no_jvm_load_no_pyspark() -> None:
    """`iotlake` (its parser and status), the sidecar's module and the stack's CLI import no pyspark or delta-spark."""
    code = (
        "import json, sys\n"
        "import streaming.cli, streaming.lake.status, streaming.lake.maintenance, stack.cli, producers.cli\n"
        "streaming.cli.build_parser()\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'delta', 'py4j'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_iotlake_starts_without_loading_the_stack() -> None:
    """Every `iotlake` command builds the whole parser; only `iotlake run` needs the stack's clients."""
    code = (
        "import json, sys\n"
        "import streaming.cli\n"
        "streaming.cli.build_parser()\n"
        "print(json.dumps(sorted(m for m in ('stack.api', 'streaming.cli.run', 'minio') if m in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
