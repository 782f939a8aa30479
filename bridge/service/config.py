"""The bridge's YAML configuration, validated with pydantic.

The user's file is merged over the commented example's defaults, so a minimal
file works and every key has one documented meaning.  Secrets may come from
the environment instead of the file (see ``ENV_SECRETS``).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# Environment variables that override (or stand in for) secrets in the file.
ENV_SECRETS = {
    "ASKWRIGHT_BRIDGE_ACCESS_TOKEN": ("bot", "access_token"),
    "ASKWRIGHT_BRIDGE_PASSWORD": ("bot", "password"),
    "ASKWRIGHT_BRIDGE_AS_TOKEN": ("appservice", "as_token"),
    "ASKWRIGHT_BRIDGE_HS_TOKEN": ("appservice", "hs_token"),
    "ASKWRIGHT_BRIDGE_STORE_PASSWORD": ("store", "password"),
}


class ConfigError(Exception):
    """One clear sentence naming the key at fault."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Homeserver(_Section):
    url: str

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")


class Bot(_Section):
    user_id: str
    access_token: str | None = None
    password: str | None = None
    device_name: str = "askwright-bridge"

    @field_validator("user_id")
    @classmethod
    def _mxid(cls, value: str) -> str:
        if not (value.startswith("@") and ":" in value):
            raise ValueError("must be a full Matrix user id such as @askbot:example.org")
        return value


class Sets(_Section):
    root: Path


class Rooms(_Section):
    default: str
    sets: dict[str, str] = Field(default_factory=dict)

    @field_validator("default")
    @classmethod
    def _room(cls, value: str) -> str:
        if not value.startswith(("!", "#")):
            raise ValueError("must be a room id (!...) or an alias (#...)")
        return value


class Store(_Section):
    """SQLite at ``path`` (the default), or PostgreSQL at ``url`` when set.
    ``path`` still names where the encryption keys (``<path>.crypto/``) live."""

    path: Path
    url: str | None = None
    password: str | None = None  # for ``url``; or ASKWRIGHT_BRIDGE_STORE_PASSWORD

    @field_validator("url")
    @classmethod
    def _postgresql(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must start with postgresql:// (leave it out for SQLite at store.path)")
        return value

    @property
    def where(self) -> str:
        """The store as named in messages: the path, or the URL without a password."""
        if self.url:
            from bridge.service.pgdialect import redact

            return redact(self.url)
        return str(self.path)


class Logging(_Section):
    level: str = "INFO"
    format: str = "text"


class Appservice(_Section):
    enabled: bool = False
    id: str = "askwright"
    url: str = "http://127.0.0.1:29331"
    listen: str = "127.0.0.1:29331"
    sender_localpart: str = "askbot"
    as_token: str | None = None
    hs_token: str | None = None

    @property
    def listen_host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host or "127.0.0.1", int(port)


def _host_port(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host or "127.0.0.1", int(port)


def _check_listen(value: str) -> str:
    _host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("must be host:port, such as 127.0.0.1:9464")
    return value


class Metrics(_Section):
    """Prometheus metrics at /metrics and liveness at /health.  In appservice
    mode both are served on the appservice listener and ``listen`` is unused."""

    enabled: bool = False
    listen: str = "127.0.0.1:9464"

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        return _check_listen(value)

    @property
    def listen_host_port(self) -> tuple[str, int]:
        return _host_port(self.listen)


# "90s", "30m", "24h", "2d", "1w"; a bare number is seconds.
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: str | int | float) -> float:
    """Seconds in a duration such as ``30m``, ``24h`` or ``2d``; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("must be a duration such as 30m, 24h or 2d")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value).lower())
        if not match:
            raise ValueError("must be a duration such as 30m, 24h or 2d")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0:
        raise ValueError("must be a duration above zero, such as 30m, 24h or 2d")
    return seconds


class Reminders(_Section):
    """A nudge in the thread of a question posted ``after`` ago and still
    unanswered, repeated at most once every ``every``."""

    enabled: bool = False
    after: str = "24h"
    every: str = "24h"

    @field_validator("after", "every", mode="before")
    @classmethod
    def _duration(cls, value: object) -> str:
        parse_duration(value)  # type: ignore[arg-type]
        return str(value)

    @property
    def after_seconds(self) -> float:
        return parse_duration(self.after)

    @property
    def every_seconds(self) -> float:
        return parse_duration(self.every)


class Encryption(_Section):
    """End-to-end encryption, in bot mode and in appservice mode (which needs
    the homeserver's appservice extensions; docs/encryption.md).

    ``trust`` decides which devices get the room keys of the bridge's
    messages: ``cross-signed`` only devices their owner cross-signed (answers
    from any other device are refused); ``tofu`` trusts a device the first
    time its keys are seen and never accepts other keys for it; ``verified``
    only the devices listed in ``verified_devices`` (answers from any other
    device are refused); ``all`` every device of every member, with no pinning.
    ``cross_signing_keys`` is the file of the bridge's own cross-signing
    keys (default: ``<store.path>.cross-signing.json``).
    """

    enabled: bool = True
    trust: Literal["cross-signed", "tofu", "verified", "all"] = "cross-signed"
    cross_signing_keys: str | None = None
    # user id -> device id -> ed25519 fingerprint (Element: Settings, Sessions, "Session key").
    verified_devices: dict[str, dict[str, str]] = Field(default_factory=dict)
    grace: str = "60s"

    @field_validator("grace", mode="before")
    @classmethod
    def _grace(cls, value: object) -> str:
        parse_duration(value)  # type: ignore[arg-type]
        return str(value)

    @field_validator("verified_devices")
    @classmethod
    def _fingerprints(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        # Element shows the key in groups of four separated by spaces.
        return {user: {device: "".join(key.split()) for device, key in devices.items()}
                for user, devices in value.items()}

    @property
    def grace_seconds(self) -> float:
        return parse_duration(self.grace)


_AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Agent(_Section):
    """One agent allowed in through the HTTP API or MCP at /mcp.  ``token`` is
    its bearer token; ``webhook_url`` (optional) is told of every accepted
    answer to its sets, each POST signed with ``webhook_secret``."""

    token: str | None = None
    webhook_url: str | None = None
    webhook_secret: str | None = None

    @field_validator("webhook_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value

    @model_validator(mode="after")
    def _needs(self) -> "Agent":
        if not self.token:
            raise ValueError("needs a token (or its environment variable, see docs/agents.md)")
        if len(self.token) < 16:
            raise ValueError("the token must be at least 16 characters")
        if self.webhook_url and not self.webhook_secret:
            raise ValueError("webhook_url needs webhook_secret to sign the deliveries")
        return self


class AgentApi(_Section):
    """Limits of the agents' HTTP API and MCP endpoint, and of webhook delivery."""

    # Requests per minute per agent (a bucket that holds a minute's worth).
    rate_per_minute: int = Field(default=120, ge=1)
    # A webhook not taken after this long is dropped, with a log line and a metric.
    webhook_drop_after: str = "24h"
    webhook_timeout: str = "10s"

    @field_validator("webhook_drop_after", "webhook_timeout", mode="before")
    @classmethod
    def _duration(cls, value: object) -> str:
        parse_duration(value)  # type: ignore[arg-type]
        return str(value)

    @property
    def drop_after_seconds(self) -> float:
        return parse_duration(self.webhook_drop_after)

    @property
    def timeout_seconds(self) -> float:
        return parse_duration(self.webhook_timeout)


def agent_env_prefix(name: str) -> str:
    """ASKWRIGHT_BRIDGE_AGENT_<NAME>_: the name upper-cased, other characters as _."""
    return "ASKWRIGHT_BRIDGE_AGENT_" + re.sub(r"[^A-Z0-9]", "_", name.upper()) + "_"


class Config(_Section):
    homeserver: Homeserver
    bot: Bot
    sets: Sets
    rooms: Rooms
    answerers: list[str] = Field(default_factory=list)
    admins: list[str] = Field(default_factory=list)
    store: Store
    logging: Logging = Field(default_factory=Logging)
    appservice: Appservice = Field(default_factory=Appservice)
    metrics: Metrics = Field(default_factory=Metrics)
    reminders: Reminders = Field(default_factory=Reminders)
    encryption: Encryption = Field(default_factory=Encryption)
    agents: dict[str, Agent] = Field(default_factory=dict)
    agent_api: AgentApi = Field(default_factory=AgentApi)

    @field_validator("agents")
    @classmethod
    def _agent_names(cls, value: dict[str, Agent]) -> dict[str, Agent]:
        for name in value:
            if not _AGENT_NAME.match(name):
                raise ValueError(f"agent name {name!r} must be letters, digits, _, . or - (64 at most)")
        return value

    @model_validator(mode="after")
    def _credentials(self) -> "Config":
        if self.appservice.enabled:
            localpart = self.bot.user_id[1:].split(":", 1)[0]
            if localpart != self.appservice.sender_localpart:
                raise ValueError("bot.user_id must be the appservice's sender_localpart user")
        elif not (self.bot.access_token or self.bot.password):
            raise ValueError("bot needs access_token or password (or ASKWRIGHT_BRIDGE_ACCESS_TOKEN)")
        return self

    @property
    def inviters(self) -> frozenset[str] | None:
        """Who may invite the bridge back into its rooms: answerers and admins,
        or anyone (None) when every member may answer."""
        return frozenset(self.answerers) | frozenset(self.admins) if self.answerers else None

    def room_for(self, set_id: str) -> str:
        return self.rooms.sets.get(set_id, self.rooms.default)

    @property
    def server_name(self) -> str:
        return self.bot.user_id.split(":", 1)[1]


def load_config(path: str | Path, environ: dict[str, str] | None = None) -> Config:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the config must be a YAML mapping")
    return parse_config(raw, base_dir=path.parent, environ=os.environ if environ is None else environ, source=str(path))


def parse_config(raw: dict[str, Any], *, base_dir: Path, environ: dict[str, str], source: str = "config") -> Config:
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for var, (section, key) in ENV_SECRETS.items():
        if environ.get(var):
            raw.setdefault(section, {})
            if isinstance(raw[section], dict):
                raw[section][key] = environ[var]
    _agent_secrets(raw, environ)
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        key = ".".join(str(p) for p in first["loc"]) or "(top level)"
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "missing":
            message = "is required"
        elif first["type"] == "extra_forbidden":
            message = "is not a known key"
        raise ConfigError(f"{source}: {key}: {message}") from None
    # Relative paths are relative to the config file, not the working directory.
    config.sets.root = (base_dir / config.sets.root).resolve()
    config.store.path = (base_dir / config.store.path).resolve()
    if config.encryption.cross_signing_keys:
        config.encryption.cross_signing_keys = str((base_dir / config.encryption.cross_signing_keys).resolve())
    return config


def _agent_secrets(raw: dict[str, Any], environ: dict[str, str]) -> None:
    """ASKWRIGHT_BRIDGE_AGENT_<NAME>_TOKEN and ..._WEBHOOK_SECRET for each agent named in the file."""
    agents = raw.get("agents")
    if not isinstance(agents, dict):
        return
    for name, section in list(agents.items()):
        prefix = agent_env_prefix(str(name))
        for key in ("token", "webhook_secret"):
            value = environ.get(prefix + key.upper())
            if value:
                section = dict(section) if isinstance(section, dict) else {}
                section[key] = value
                agents[name] = section
    raw["agents"] = agents


def world_readable(path: str | Path) -> bool:
    """True when others can read the file that holds secrets."""
    try:
        return bool(Path(path).stat().st_mode & (stat.S_IROTH | stat.S_IRGRP))
    except OSError:
        return False
