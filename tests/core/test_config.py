"""Settings: every one documented in docs/settings.md, parsed and validated at start."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from core.config import CLIENT_SETTINGS, Config, ConfigError, load

SETTINGS_DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def test_every_setting_is_in_the_settings_table() -> None:
    documented = set(re.findall(r"^\| `(BOXTRAIL_[A-Z0-9_]+)` \|", SETTINGS_DOC.read_text(), re.M))
    settings = {"BOXTRAIL_" + f.name.upper() for f in msgspec.structs.fields(Config)}
    settings |= {"BOXTRAIL_CONFIG", *CLIENT_SETTINGS}
    assert settings - documented == set(), "undocumented settings"
    assert documented - settings == set(), "documented settings that do not exist"


def test_defaults() -> None:
    config = load({})
    assert (config.host, config.port, config.data_dir, config.storage) == (
        "127.0.0.1", 8780, "./data", "local")
    assert config.box_host_pattern == "{box}.box.parallelsandbox.com"


def test_environment_over_file_over_default(tmp_path: Path) -> None:
    file = tmp_path / "boxtrail.toml"
    file.write_text('port = 9000\ndata_dir = "/srv/logs"\nflush_interval_s = 2.5\n')
    config = load({"BOXTRAIL_CONFIG": str(file), "BOXTRAIL_PORT": "9100"})
    assert (config.port, config.data_dir, config.flush_interval_s) == (9100, "/srv/logs", 2.5)


@pytest.mark.parametrize(("env", "message"), [
    ({"BOXTRAIL_PORT": "http"}, "BOXTRAIL_PORT='http' is not a valid"),
    ({"BOXTRAIL_PORT": "70000"}, "BOXTRAIL_PORT must be between 0 and 65535, got 70000"),
    ({"BOXTRAIL_STORAGE": "ftp"}, "invalid setting"),
    ({"BOXTRAIL_STORAGE": "s3"}, "needs BOXTRAIL_S3_BUCKET"),
    ({"BOXTRAIL_BOX_HOST_PATTERN": "box.example.com"}, "must contain {box}"),
    ({"BOXTRAIL_MAX_BODY_BYTES": "0"}, "BOXTRAIL_MAX_BODY_BYTES must be between 1024 and"),
    ({"BOXTRAIL_FLUSH_INTERVAL": "5"}, "unknown setting BOXTRAIL_FLUSH_INTERVAL"),
    ({"BOXTRAIL_CONFIG": "/nonexistent.toml"}, "cannot read"),
])
def test_bad_settings_fail_at_start(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(env)


# Every setting has a range: zero, negative and absurd values stop the server at start,
# unless docs/settings.md documents what the value means. A new setting must be placed here.
MEANINGFUL_ZERO = {"port", "rate_limit_events", "worker_processes", "usage_credits_per_usd"}
# AWS, local storage, no prefix, the id from the data directory or host name, one node,
# every price 0, no usage sink (and so no secret)
MEANINGFUL_EMPTY = {"s3_endpoint", "s3_bucket", "s3_prefix", "node_id", "bus_url",
                    "usage_prices", "usage_sink_url", "usage_sink_secret"}
CHOICES = {"storage", "iceberg"}
_FIELDS = msgspec.structs.fields(Config)
NUMERIC = [f for f in _FIELDS if f.type in (int, float)]


def _row(setting: str) -> str:
    match = re.search(rf"^\| `{setting}` \|.*$", SETTINGS_DOC.read_text(), re.M)
    assert match, setting
    return match.group(0)


def test_every_setting_has_a_decision_here() -> None:
    strings = {f.name for f in _FIELDS if f.type is str}
    assert {f.name for f in _FIELDS} == {f.name for f in NUMERIC} | strings | CHOICES


@pytest.mark.parametrize("field", NUMERIC, ids=[f.name for f in NUMERIC])
def test_every_numeric_setting_refuses_nonsense(field: msgspec.structs.FieldInfo) -> None:
    name = "BOXTRAIL_" + field.name.upper()
    absurd = ["1e30", "nan", "inf", "-inf"] if field.type is float else [str(10**18)]
    for raw in ["-1", *absurd]:
        with pytest.raises(ConfigError, match=name):
            load({name: raw})
    if field.name in MEANINGFUL_ZERO:
        assert getattr(load({name: "0"}), field.name) == 0
        assert "`0`" in _row(name), f"{name}=0 is accepted: docs/settings.md must say what it means"
    else:
        with pytest.raises(ConfigError, match=name):
            load({name: "0"})
    assert getattr(load({name: str(field.default)}), field.name) == field.default


@pytest.mark.parametrize("field", [f.name for f in _FIELDS if f.type is str])
def test_every_string_setting_refuses_empty_unless_meaningful(field: str) -> None:
    name = "BOXTRAIL_" + field.upper()
    if field in MEANINGFUL_EMPTY:
        assert getattr(load({name: ""}), field) == ""
    else:
        with pytest.raises(ConfigError, match=name):
            load({name: ""})


@pytest.mark.parametrize(("env", "message"), [
    ({"BOXTRAIL_BOX_HOST_PATTERN": "{box}.{box}.example.com"}, "exactly once"),
    ({"BOXTRAIL_S3_ENDPOINT": "localhost:9000"}, "BOXTRAIL_S3_ENDPOINT"),
    ({"BOXTRAIL_COMPACT_MIN_FILES": "1"}, "BOXTRAIL_COMPACT_MIN_FILES"),  # would rewrite forever
    ({"BOXTRAIL_FLUSH_INTERVAL_S": "0.001"}, "BOXTRAIL_FLUSH_INTERVAL_S"),
    ({"BOXTRAIL_HEADER_TIMEOUT_S": "0"}, "BOXTRAIL_HEADER_TIMEOUT_S"),
])
def test_settings_that_would_make_busy_or_endless_loops(env: dict[str, str], message: str
                                                        ) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(env)


def test_a_config_file_is_held_to_the_same_ranges(tmp_path: Path) -> None:
    file = tmp_path / "boxtrail.toml"
    file.write_text("compact_interval_s = 0\n")
    with pytest.raises(ConfigError, match="BOXTRAIL_COMPACT_INTERVAL_S"):
        load({"BOXTRAIL_CONFIG": str(file)})
