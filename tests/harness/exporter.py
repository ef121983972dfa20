"""The exporter under test (tests/test_exporter_*.py): one scrape of its collector (no NVML), as
Prometheus gets it, and its samples by name and labels; the installed ``nvc-py exporter`` started."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from harness.fakegpus import H100 as GPU0
from harness.installed import SCRIPTS
from nvc.exporter.collector import Collector, Sources

KEY = GPU0[4:].lower()


def scrape(state: Path, tmp_path: Path, **given: str) -> str:
    """One scrape's text from a collector over ``state`` (no NVML), as Prometheus gets it."""
    sources = Sources(
        str(state),
        given.get("log", str(tmp_path / "no.log")),
        given.get("socket", str(tmp_path / "no.sock")),
        given.get("plugin", str(tmp_path / "no-plugin.json")),
    )
    registry = CollectorRegistry()
    registry.register(Collector(sources, None))
    return generate_latest(registry).decode()


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample by (name, labels); the text must parse, and no label set may come twice."""
    found: dict[tuple[str, frozenset], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in found, f"{key} twice"
            found[key] = sample.value
    return found


def sample(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def start(tmp_path: Path, listen: str, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """The installed ``nvc-py exporter``, started; and where it says it listens."""
    proc = subprocess.Popen(
        [str(SCRIPTS / "nvc-py"), "exporter", "--listen", listen, *args],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    line = proc.stderr.readline()
    found = re.match(r"nvc-py exporter: listening on (\S+)", line)
    assert found, (line, proc.poll())
    return proc, found.group(1)
