"""docker-compose.yml against the Compose specification's JSON schema (the one
``check-jsonschema`` ships, from PyPI), and its settings against the service's: every
``BOXTRAIL_*`` it or the Dockerfile sets is in the settings table of docs/settings.md and
loads as a node's configuration. No engine starts it here (see docs/image.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from core.config import ConfigError, load

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
SETTINGS_DOC = REPO / "docs" / "settings.md"


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                           "vendor.compose-spec", str(path)],
                          capture_output=True, text=True, timeout=120)


def test_the_compose_file_follows_the_compose_specification() -> None:
    result = validate(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("spoil", ["misspelled key", "wrong type", "unknown condition"])
def test_the_check_fails_a_spoiled_copy(spoil: str, tmp_path: Path) -> None:
    """The check can fail: each spoiled copy of the file is refused."""
    doc = yaml.safe_load(COMPOSE.read_text())
    node = doc["services"]["node1"]
    if spoil == "misspelled key":
        node["enviroment"] = node.pop("environment")
    elif spoil == "wrong type":
        node["stop_grace_period"] = ["30s"]
    else:
        next(iter(node["depends_on"].values()))["condition"] = "service_ready"
    copy = tmp_path / "docker-compose.yml"
    copy.write_text(yaml.safe_dump(doc))
    assert validate(copy).returncode != 0


def node_environments() -> dict[str, dict[str, str]]:
    doc = yaml.safe_load(COMPOSE.read_text())
    return {name: {k: str(v) for k, v in (service.get("environment") or {}).items()}
            for name, service in doc["services"].items() if service.get("image") ==
            "boxtrail:local"}


def dockerfile_env() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if line.startswith("ENV "):
            found |= dict(re.findall(r"(BOXTRAIL_[A-Z0-9_]+)=(\S+)", line))
    return found


def test_every_boxtrail_setting_it_sets_exists_and_loads() -> None:
    documented = set(re.findall(r"^\| `(BOXTRAIL_[A-Z0-9_]+)` \|", SETTINGS_DOC.read_text(),
                                re.M))
    nodes = node_environments()
    assert set(nodes) == {"node1", "node2", "node3"}
    ids = set()
    for name, env in nodes.items():
        env = {**dockerfile_env(), **env}
        boxtrail = {k for k in env if k.startswith("BOXTRAIL_")}
        assert boxtrail - documented == set(), name
        try:
            config = load(env)
        except ConfigError as exc:
            pytest.fail(f"{name}: {exc}")
        ids.add(config.node_id)
        assert config.catalog_url.startswith("postgresql://") and config.storage == "s3"
    assert len(ids) == 3, "the nodes need distinct BOXTRAIL_NODE_IDs"
    assert set(dockerfile_env()) - documented == set()
