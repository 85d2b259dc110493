"""Settings: loaded once at start from ``BOXTRAIL_*`` variables and an optional TOML file.

Every field of :class:`Config` is a setting named ``BOXTRAIL_<FIELD>``; the table in
docs/settings.md documents each one (``tests/core/test_config.py`` fails on one that is not).
Precedence: environment, then the file named by ``BOXTRAIL_CONFIG``, then the default.
"""

from __future__ import annotations

import base64
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import msgspec

PREFIX = "BOXTRAIL_"
# Read by the command-line clients (search, tail, sourcemaps upload), not by the server.
CLIENT_SETTINGS = frozenset({"BOXTRAIL_URL", "BOXTRAIL_API_KEY"})


class ConfigError(Exception):
    """A setting is missing, malformed or out of range."""


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: int = 8780
    data_dir: str = "./data"
    storage: Literal["local", "s3"] = "local"
    s3_endpoint: str = ""
    s3_bucket: str = ""
    s3_prefix: str = ""
    s3_region: str = "us-east-1"
    box_host_pattern: str = "{box}.box.parallelsandbox.com"
    # Ingest limits.
    max_body_bytes: int = 1 << 20
    max_inflated_bytes: int = 5 << 20
    max_events_per_request: int = 1000
    max_message_bytes: int = 16 << 10
    max_stack_bytes: int = 64 << 10
    max_attrs: int = 64
    max_attr_bytes: int = 1 << 10
    rate_limit_events: float = 20_000.0
    rate_limit_burst: float = 60_000.0
    # Durability and the write path.
    wal_segment_bytes: int = 64 << 20
    flush_interval_s: float = 5.0
    flush_max_rows: int = 200_000
    buffer_max_rows: int = 2_000_000
    compact_interval_s: float = 60.0
    compact_min_files: int = 8
    # Deletions: how long a file a deletion replaced stays for reads that planned it.
    deletion_grace_s: float = 5.0
    # Reading.
    query_threads: int = 2
    tail_max_per_tenant: int = 20
    tail_max_behind: int = 10_000
    tail_heartbeat_s: float = 15.0
    # Symbolication caches (memory, per process).
    symbolicate_cache_bytes: int = 512 << 20
    symbolicate_stack_cache_bytes: int = 64 << 20
    # Processes for CPU-heavy reads and uploads (core.workers); 0: threads of the server.
    worker_processes: int = 1
    # The HTTP server's own limits, before a request reaches the app (boxtrail.server).
    header_timeout_s: float = 10.0
    # Every query the search language accepts must fit in a GET (a tail's EventSource can
    # send nothing else): its 2,000 characters (query.language.MAX_LENGTH) take up to 12
    # URL bytes each percent-encoded (4 UTF-8 bytes, '%XX' each), 24,000 in all, and the
    # path and the other parameters fit in the rest. This is also the least allowed
    # (RANGES); tests/query/test_long_queries.py holds the two together.
    max_url_bytes: int = 32 << 10
    max_header_bytes: int = 32 << 10
    max_headers: int = 100
    # The web console's sign-in (tenancy.sessions): seconds a session cookie lives.
    session_ttl_s: int = 604_800
    # Cluster mode (docs/cluster.md): the metadata database shared by the nodes, and this
    # node's id ('' = the data directory's, else the host name; cluster.nodes).
    catalog_url: str = "sqlite:"
    bus_url: str = ""  # '' = in-process (one node); redis://host:6379/0 (cluster.bus)
    bus_retain_s: float = 30.0  # how long the stream keeps entries
    node_id: str = ""
    # Usage (docs/usage.md): unit prices in USD per kind, as a JSON object ('' = all 0), and
    # credits per USD; the sink usage events are pushed to ('' = none), its Standard
    # Webhooks secret (whsec_...), and the longest wait between two tries.
    usage_prices: str = ""
    usage_credits_per_usd: float = 100.0
    usage_sink_url: str = ""
    usage_sink_secret: str = ""
    usage_sink_max_backoff_s: float = 30.0
    # Apache Iceberg tables over the Parquet files, for external engines (docs/iceberg.md):
    # off or on, and how long a replaced snapshot stays readable (time travel) before it
    # expires and the files only it read are deleted.
    iceberg: Literal["off", "on"] = "off"
    iceberg_snapshot_retain_s: float = 3600.0


def _coerce(name: str, raw: str, typ: object) -> object:
    if typ is int:
        return int(raw)
    if typ is float:
        return float(raw)
    return raw


def load(environ: Mapping[str, str] | None = None) -> Config:
    """Build the config from ``environ`` (default: the process environment) and validate it."""
    env = os.environ if environ is None else environ
    values: dict[str, object] = {}
    file = env.get(PREFIX + "CONFIG")
    if file:
        try:
            values.update(tomllib.loads(Path(file).read_text()))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read {PREFIX}CONFIG={file}: {exc}") from exc
    fields = {f.name: f.type for f in msgspec.structs.fields(Config)}
    for key, raw in env.items():
        if not key.startswith(PREFIX) or key == PREFIX + "CONFIG" or key in CLIENT_SETTINGS:
            continue
        name = key[len(PREFIX) :].lower()
        if name not in fields:
            raise ConfigError(f"unknown setting {key}; see the settings table in docs/settings.md")
        try:
            values[name] = _coerce(name, raw, fields[name])
        except ValueError as exc:
            raise ConfigError(f"{key}={raw!r} is not a valid {fields[name]}") from exc
    try:
        config = msgspec.convert(values, Config, str_keys=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid setting: {exc}") from exc
    validate(config)
    return config


_KIB, _MIB, _GIB = 1 << 10, 1 << 20, 1 << 30

# Inclusive ranges of the numeric settings. Zero is inside one only where it means
# something docs/settings.md says (port 0: any free port; rate 0: no limit);
# elsewhere 0 is a busy loop (intervals), a refusal of everything (limits) or a crash.
RANGES: dict[str, tuple[float, float]] = {
    "port": (0, 65535),
    "max_body_bytes": (1 * _KIB, 1 * _GIB),
    "max_inflated_bytes": (1 * _KIB, 4 * _GIB),
    "max_events_per_request": (1, 100_000),
    "max_message_bytes": (1, 16 * _MIB),
    "max_stack_bytes": (1, 16 * _MIB),
    "max_attrs": (1, 10_000),
    "max_attr_bytes": (1, 16 * _MIB),
    "rate_limit_events": (0, 1e9),
    "rate_limit_burst": (1, 1e12),
    "wal_segment_bytes": (1 * _MIB, 64 * _GIB),
    "flush_interval_s": (0.05, 86_400),
    "flush_max_rows": (1, 100_000_000),
    "buffer_max_rows": (1, 1_000_000_000),
    "compact_interval_s": (0.1, 86_400),
    "compact_min_files": (2, 1_000_000),  # 1: one file rewritten into itself forever
    "deletion_grace_s": (0.1, 86_400),
    "query_threads": (1, 1024),
    "tail_max_per_tenant": (1, 1_000_000),
    "tail_max_behind": (1, 100_000_000),
    "tail_heartbeat_s": (0.1, 86_400),
    "symbolicate_cache_bytes": (1 * _MIB, 1 << 40),
    "symbolicate_stack_cache_bytes": (1 * _MIB, 1 << 40),
    "worker_processes": (0, 64),  # 0: the same jobs on one thread of the server
    "header_timeout_s": (0.1, 3600),
    "max_url_bytes": (32 * _KIB, 1 * _MIB),  # less refuses queries the language accepts
    "max_header_bytes": (1 * _KIB, 1 * _MIB),
    "max_headers": (8, 10_000),
    "session_ttl_s": (1, 366 * 86_400),
    "bus_retain_s": (1, 86_400),
    "usage_credits_per_usd": (0, 1e12),
    "usage_sink_max_backoff_s": (0.1, 86_400),
    "iceberg_snapshot_retain_s": (1, 366 * 86_400),
}
# Settings whose empty value means something: AWS's endpoint, no bucket (local), no prefix,
# the node id from the data directory or host name.
MAY_BE_EMPTY = frozenset({"s3_endpoint", "s3_bucket", "s3_prefix", "node_id", "bus_url",
                          "usage_prices", "usage_sink_url", "usage_sink_secret"})


def prices(config: Config) -> dict[str, float]:
    """``BOXTRAIL_USAGE_PRICES``: USD per unit of each kind it names (core.usage.KINDS)."""
    from core.usage import KINDS  # pyarrow with it: only when prices are read

    if not config.usage_prices.strip():
        return {}
    try:
        table = msgspec.json.decode(config.usage_prices, type=dict[str, float])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"{PREFIX}USAGE_PRICES must be a JSON object of USD per unit, as "
                          f'{{"ingest.events": 0.000001}}: {exc}') from None
    for kind, price in table.items():
        if kind not in KINDS:
            raise ConfigError(f"{PREFIX}USAGE_PRICES: {kind[:60]!r} is not a usage kind "
                              f"({', '.join(KINDS)})")
        if not 0 <= price < 1e9:  # NaN too
            raise ConfigError(f"{PREFIX}USAGE_PRICES: the price of {kind} must be 0 or more")
    return table


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) and not value.is_integer() else f"{value:.0f}"


def validate(config: Config) -> None:
    for name, (low, high) in RANGES.items():
        value = getattr(config, name)
        if not low <= value <= high:  # NaN fails every comparison, so it lands here too
            raise ConfigError(f"{PREFIX}{name.upper()} must be between {_number(low)} and "
                              f"{_number(high)}, got {value!r}")
    for field in msgspec.structs.fields(Config):
        if field.type is str and field.name not in MAY_BE_EMPTY and not getattr(
                config, field.name).strip():
            raise ConfigError(f"{PREFIX}{field.name.upper()} must not be empty")
    if config.storage == "s3" and not config.s3_bucket:
        raise ConfigError(f"{PREFIX}STORAGE=s3 needs {PREFIX}S3_BUCKET")
    if config.s3_endpoint and not config.s3_endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"{PREFIX}S3_ENDPOINT must be a URL such as http://127.0.0.1:9000, "
                          f"got {config.s3_endpoint!r}")
    if config.catalog_url != "sqlite:" and not config.catalog_url.startswith(
            ("postgresql://", "postgres://")):
        raise ConfigError(f"{PREFIX}CATALOG_URL must be sqlite: (the default: a file in the "
                          "data directory) or a PostgreSQL URL such as "
                          "postgresql://user:password@host:5432/boxtrail")
    if config.bus_url and not config.bus_url.startswith(("redis://", "rediss://")):
        raise ConfigError(f"{PREFIX}BUS_URL must be empty (one node) or a Redis URL such as "
                          "redis://127.0.0.1:6379/0 (NATS is not supported: see "
                          "docs/cluster.md)")
    if config.bus_url and config.catalog_url == "sqlite:":
        raise ConfigError(f"{PREFIX}BUS_URL needs a shared catalog: set {PREFIX}CATALOG_URL "
                          "to a PostgreSQL URL (nodes on SQLite share nothing)")
    if config.node_id and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", config.node_id):
        raise ConfigError(f"{PREFIX}NODE_ID must be 1-64 letters, digits, '.', '_' or '-', "
                          f"starting with a letter or digit, got {config.node_id!r}")
    prices(config)
    if config.usage_sink_url:
        if not config.usage_sink_url.startswith(("http://", "https://")):
            raise ConfigError(f"{PREFIX}USAGE_SINK_URL must be an http(s) URL, got "
                              f"{config.usage_sink_url[:80]!r}")
        secret = config.usage_sink_secret.removeprefix("whsec_")
        try:
            key = base64.b64decode(secret, validate=True)
        except ValueError:
            key = b""
        if len(key) < 16:
            raise ConfigError(f"{PREFIX}USAGE_SINK_URL needs {PREFIX}USAGE_SINK_SECRET: "
                              "whsec_ and at least 16 random bytes in base64 (Standard "
                              "Webhooks), e.g. whsec_$(head -c 24 /dev/urandom | base64)")
    if config.box_host_pattern.count("{box}") != 1:
        raise ConfigError(f"{PREFIX}BOX_HOST_PATTERN must contain {{box}} exactly once, "
                          f"as in {{box}}.box.example.com")
