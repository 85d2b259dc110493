"""Settings: every one documented in the README, parsed and validated at start."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from boxtrail.config import CLIENT_SETTINGS, Config, ConfigError, load

README = Path(__file__).resolve().parent.parent / "README.md"


def test_every_setting_is_in_the_readme_table() -> None:
    documented = set(re.findall(r"^\| `(BOXTRAIL_[A-Z0-9_]+)` \|", README.read_text(), re.M))
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
    ({"BOXTRAIL_PORT": "70000"}, "0..65535"),
    ({"BOXTRAIL_STORAGE": "ftp"}, "invalid setting"),
    ({"BOXTRAIL_STORAGE": "s3"}, "needs BOXTRAIL_S3_BUCKET"),
    ({"BOXTRAIL_BOX_HOST_PATTERN": "box.example.com"}, "must contain {box}"),
    ({"BOXTRAIL_MAX_BODY_BYTES": "0"}, "must be positive"),
    ({"BOXTRAIL_FLUSH_INTERVAL": "5"}, "unknown setting BOXTRAIL_FLUSH_INTERVAL"),
    ({"BOXTRAIL_CONFIG": "/nonexistent.toml"}, "cannot read"),
])
def test_bad_settings_fail_at_start(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(env)
