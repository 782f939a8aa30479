"""The config file: the example loads, a bad file names its key and exits 2."""

from __future__ import annotations

import asyncio

from pathlib import Path

import pytest
import yaml

from bridge.cli import main
from bridge.service.config import ConfigError, load_config, parse_config
from helpers.config import GOOD

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


TOKEN = {"ASKWRIGHT_BRIDGE_ACCESS_TOKEN": "syt_a_real_looking_token"}


def test_the_example_config_loads():
    # Once its placeholder token is given (here by the environment); left as
    # it is, the placeholder is named.
    with pytest.raises(ConfigError, match="bot.access_token: '...' is the example's placeholder"):
        load_config(ROOT / "config.example.yaml", environ={})
    config = load_config(ROOT / "config.example.yaml", environ=TOKEN)
    assert config.homeserver.url == "http://127.0.0.1:8008"
    assert config.sets.root == (ROOT / "ask").resolve()
    assert config.answerers == [] and config.appservice.enabled is False


def test_the_largest_file_kept_is_20_mib_unless_configured(tmp_path):
    assert load_config(ROOT / "config.example.yaml", environ=TOKEN).attachments.max_bytes == 20 * 1024 * 1024
    assert load_config(write(tmp_path, GOOD), environ={}).attachments.max_bytes == 20 * 1024 * 1024
    data = {**GOOD, "attachments": {"max_bytes": 12 * 1024 * 1024}}
    assert load_config(write(tmp_path, data), environ={}).attachments.max_bytes == 12 * 1024 * 1024


def test_relative_paths_are_relative_to_the_config_file(tmp_path):
    config = load_config(write(tmp_path, GOOD), environ={})
    assert config.store.path == tmp_path / "bridge.sqlite"


def test_a_room_version_12_id_without_server_part_is_accepted(tmp_path):
    data = {**GOOD, "rooms": {"default": "!Ig0GUkZiMMm93Etf3cbd4B_Fcp62kK212uJK-HZ50rQ"}}
    assert load_config(write(tmp_path, data), environ={}).rooms.default.startswith("!Ig0")


@pytest.mark.parametrize("mutate, key", [
    (lambda d: d.pop("homeserver"), "homeserver"),
    (lambda d: d["homeserver"].update(url="127.0.0.1:8008"), "homeserver.url"),
    (lambda d: d["bot"].update(user_id="askbot"), "bot.user_id"),
    (lambda d: d["rooms"].update(default="room"), "rooms.default"),
    (lambda d: d.update(answerers="@a:b"), "answerers"),
    (lambda d: d.update(colour="blue"), "colour"),
    (lambda d: d["bot"].pop("access_token"), "bot"),
    (lambda d: d.update(admins=["notauser"]), "admins"),
    (lambda d: d.update(answerers=["@a:b", "bob"]), "answerers"),
    (lambda d: d.update(attachments={"max_bytes": 0}), "attachments.max_bytes"),
    (lambda d: d.update(attachments={"max_bytes": "20MB"}), "attachments.max_bytes"),
    (lambda d: d.update(attachments={"max_size": 10}), "attachments.max_size"),
    (lambda d: d.update(agents={"planner\n": {"token": "planner-token-0123456789"}}), "agents"),
    (lambda d: d.update(logging={"level": "VERBOSE"}), "logging.level"),
    (lambda d: d.update(logging={"format": "xml"}), "logging.format"),
])
def test_a_bad_key_is_named(tmp_path, mutate, key):
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in GOOD.items()}
    mutate(data)
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, data), environ={})
    assert f": {key}:" in str(caught.value)


def test_secrets_can_come_from_the_environment(tmp_path):
    data = {**GOOD, "bot": {"user_id": "@askbot:example.org"}}
    config = parse_config(data, base_dir=tmp_path, environ={"ASKWRIGHT_BRIDGE_ACCESS_TOKEN": "from-env"})
    assert config.bot.access_token == "from-env"


@pytest.mark.parametrize("text", ["homeserver: [", "- a list", ""])
def test_run_with_an_unusable_file_exits_2_with_one_line(tmp_path, capsys, text):
    path = write(tmp_path, text)
    assert main(["run", "-c", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err


def test_a_key_written_twice_is_refused_naming_both_lines_not_taken_as_the_last(tmp_path, capsys):
    # The first "rooms:" (its sets' mapping) was dropped without a word, and
    # the set went to the default room.
    text = yaml.safe_dump(GOOD) + "rooms:\n  sets: {release: '!elsewhere:example.org'}\n"
    assert "rooms:" in yaml.safe_dump(GOOD)
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=r"at line \d+, column 1: the key 'rooms' is written twice in one "
                                          r"mapping \(first at line \d+\); keep one"):
        load_config(path, environ={})
    assert main(["run", "-c", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "written twice" in err


def test_keys_a_yaml_merge_brings_may_be_overridden():
    from bridge.service.yamlfile import load_yaml

    text = "base: &b {after: 2h, every: 4h}\nreminders:\n  <<: *b\n  after: 30m\n"
    assert load_yaml(text)["reminders"] == {"after": "30m", "every": "4h"}


def test_run_with_a_missing_file_exits_2(tmp_path, capsys):
    assert main(["run", "-c", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_run_names_the_bad_key(tmp_path, capsys):
    data = {**GOOD, "homeserver": {"url": "ftp://x"}}
    assert main(["run", "-c", str(write(tmp_path, data))]) == 2
    err = capsys.readouterr().err
    assert "homeserver.url" in err and "secret-token" not in err


@pytest.mark.parametrize("extra, where, words", [
    ({"metrics": {"enabled": "maybe"}}, "metrics.enabled", "true or false"),
    ({"agent_api": {"rate_per_minute": 0}}, "agent_api.rate_per_minute", "at least 1"),
    ({"agent_api": {"max_waits": 0}}, "agent_api.max_waits", "at least 1"),
    ({"agent_api": {"max_waits_total": "lots"}}, "agent_api.max_waits_total", "whole number"),
    ({"agent_api": {"rate_per_minute": "many"}}, "agent_api.rate_per_minute", "whole number"),
    ({"attachments": {"max_bytes": "--5"}}, "attachments.max_bytes", "whole number"),
    ({"attachments": {"max_bytes": "\u00b2"}}, "attachments.max_bytes", "whole number"),
    ({"answerers": ["@a:b", 3]}, "answerers.1", "text"),
    ({"rooms": {"default": "!r", "sets": {"a": 5}}}, "rooms.sets.a", "text"),
    ({"encryption": {"trust": "everyone"}}, "encryption.trust", "'cross-signed', 'tofu', 'verified', 'all'"),
    ({"bot": "askbot"}, "bot", "mapping"),
    ({"logging": None}, "logging", "mapping"),
    ({"store": {"path": 5}}, "store.path", "path"),
    ({"reminders": {"every": "often"}}, "reminders.every", "duration"),
    # Unchecked, these stopped the start with a traceback (exit 1).
    ({"appservice": {"listen": "garbage"}}, "appservice.listen", "host:port"),
    ({"appservice": {"listen": "127.0.0.1:99999"}}, "appservice.listen", "host:port"),
    ({"appservice": {"url": "nope"}}, "appservice.url", "http://"),
    ({"homeserver": {"url": "http://"}}, "homeserver.url", "no host"),
    ({"homeserver": {"url": "http://127.0.0.1:notaport"}}, "homeserver.url", "no port"),
    # Taken, then joined in vain and warned of over and over: the set never posted.
    ({"rooms": {"default": "!r:x", "sets": {"s": "room"}}}, "rooms.sets.s", "room id"),
    # An empty server name, a space: accepted here, refused where admins or answerers name them.
    ({"bot": {"user_id": "@askbot:", "access_token": "t"}}, "bot.user_id", "Matrix user id"),
    ({"bot": {"user_id": "@Ask Bot:example.org", "access_token": "t"}}, "bot.user_id", "Matrix user id"),
])
def test_a_value_of_the_wrong_kind_names_its_key_and_what_it_takes(tmp_path, extra, where, words):
    with pytest.raises(ConfigError) as caught:
        parse_config({**GOOD, **extra}, base_dir=tmp_path, environ={})
    assert f"config: {where}: " in str(caught.value) and words in str(caught.value)


def test_what_yaml_users_write_for_booleans_numbers_and_durations_is_taken(tmp_path):
    config = parse_config({**GOOD, "metrics": {"enabled": "yes"}, "agent_api": {"rate_per_minute": "30"},
                           "reminders": {"enabled": True, "after": 3600, "every": "2d"},
                           "encryption": {"verified_devices": {"@a:hs": {"DEV": "abcd efgh"}}}},
                          base_dir=tmp_path, environ={})
    assert config.metrics.enabled is True and config.agent_api.rate_per_minute == 30
    assert config.reminders.after_seconds == 3600 and config.reminders.every_seconds == 2 * 86400
    assert config.encryption.verified_devices == {"@a:hs": {"DEV": "abcdefgh"}}
    assert config.logging.level == "INFO" and config.appservice.enabled is False  # defaults of sections left out


def test_move_sets_with_a_config_naming_no_store_says_so_and_makes_none(tmp_path, capsys):
    """It made an empty store where the config pointed, then said that store
    knew no set under the old root: the wrong config went unnoticed."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in GOOD.items()}
    data["store"] = {"path": str(tmp_path / "nowhere.sqlite")}
    data["sets"] = {"root": str(tmp_path / "sets")}
    assert main(["store", "move-sets", "-c", str(write(tmp_path, data)), "--from", str(tmp_path / "old")]) == 2
    assert "there is no store at" in capsys.readouterr().err
    assert not (tmp_path / "nowhere.sqlite").exists()


def test_a_wait_timeout_that_is_not_a_number_says_so(tmp_path, capsys):
    with pytest.raises(SystemExit) as caught:
        main(["wait", str(tmp_path), "--timeout", "nan"])
    assert caught.value.code == 2 and "not a number of seconds: 'nan'" in capsys.readouterr().err


def test_a_config_that_is_not_utf8_is_one_line_and_exit_2_not_a_traceback(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_bytes(yaml.safe_dump(GOOD).encode() + "# caf\u00e9\n".encode("latin-1"))
    assert main(["run", "-c", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not UTF-8" in err


def test_two_agents_with_one_token_or_one_environment_name_are_refused(tmp_path):
    # The second was authenticated as the first: it saw the first's sets, never its own.
    same = {**GOOD, "agents": {"planner": {"token": "the-same-token-0123456789"},
                               "other": {"token": "the-same-token-0123456789"}}}
    with pytest.raises(ConfigError, match="agents.other.token is the token of agents.planner"):
        parse_config(same, base_dir=tmp_path, environ={})
    # release-agent and release.agent both read ASKWRIGHT_BRIDGE_AGENT_RELEASE_AGENT_TOKEN.
    alike = {**GOOD, "agents": {"release-agent": {"token": "first-token-0123456789"},
                                "release.agent": {"token": "second-token-0123456789"}}}
    with pytest.raises(ConfigError, match="share the environment variables ASKWRIGHT_BRIDGE_AGENT_RELEASE_AGENT_"):
        parse_config(alike, base_dir=tmp_path, environ={})


def test_a_listen_address_in_brackets_is_bound_without_them(tmp_path):
    config = parse_config({**GOOD, "metrics": {"enabled": True, "listen": "[::1]:9464"}}, base_dir=tmp_path,
                          environ={})
    assert config.metrics.listen_host_port == ("::1", 9464)


async def test_the_bot_modes_listener_binds_a_bracketed_address_and_a_taken_one_is_a_config_refused(tmp_path):
    # "[::1]:port" was handed to the listener as written (brackets and all):
    # a traceback after the first sync, exit 1; a port in use was a traceback
    # and exit 1 too, which a service manager restarts in a loop.
    import socket

    from bridge.devserver import free_port
    from bridge.service.operators.metrics import Metrics
    from bridge.service.operators.operators import Operators
    from bridge.service.storage.store import Store

    port = free_port()
    config = parse_config({**GOOD, "metrics": {"enabled": True, "listen": f"[::1]:{port}"}}, base_dir=tmp_path,
                          environ={})
    store = Store(tmp_path / "bridge.sqlite")
    ops = Operators(config, store, Metrics())
    stop = asyncio.Event()
    try:
        await ops.start(send=None, poster=None, own_user=lambda _u: False, stop=stop)
        with socket.create_connection(("::1", port), timeout=5):
            pass
    finally:
        stop.set()
        await ops.close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = parse_config({**GOOD, "metrics": {"enabled": True, "listen": f"127.0.0.1:{taken.getsockname()[1]}"}},
                            base_dir=tmp_path, environ={})
        again = Operators(busy, store, Metrics())
        try:
            with pytest.raises(ConfigError, match="metrics.listen: 127.0.0.1:[0-9]+ can't be listened on"):
                await again.start(send=None, poster=None, own_user=lambda _u: False, stop=asyncio.Event())
        finally:
            await again.close()
    store.close()


def test_run_with_a_sets_root_that_is_not_there_names_it_and_exits_2(tmp_path, capsys):
    # It started, said it was ready, and its folder watch crash-looped with
    # "No path was found", naming no key.
    path = write(tmp_path, {**GOOD, "sets": {"root": str(tmp_path / "not-here")}})
    assert main(["run", "-c", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sets.root" in err and "not-here" in err


@pytest.mark.parametrize("after", [".inf", ".nan", "1.0e+20"])
def test_a_duration_no_reading_takes_again_is_refused_with_the_rest(tmp_path, after):
    """A YAML float passed as a duration and was kept as str(float): "inf"
    or "1e+20", which the reading after the first sync refused, ending the
    bridge with a traceback (exit 1)."""
    path = write(tmp_path, yaml.safe_dump(GOOD) + f"reminders:\n  after: {after}\n")
    with pytest.raises(ConfigError, match="reminders.after"):
        load_config(path, environ={})


def test_a_duration_given_as_a_plain_number_of_seconds_reads_back_the_same(tmp_path):
    from bridge.service.sections import parse_duration

    config = load_config(write(tmp_path, yaml.safe_dump(GOOD) + "reminders:\n  after: 90.5\n"), environ={})
    assert parse_duration(config.reminders.after) == 90.5


def test_run_with_a_store_folder_it_cant_write_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "sets").mkdir()
    (tmp_path / "blocker").write_text("a file where the store's folder should be")
    data = {**GOOD, "store": {"path": str(tmp_path / "blocker" / "bridge.sqlite")}, "sets": {"root": str(tmp_path / "sets")}}
    assert main(["run", "-c", str(write(tmp_path, data))]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "store.path" in err and "Traceback" not in err


def test_a_config_refused_once_started_exits_2_as_at_reading(tmp_path, monkeypatch):
    """An appservice without its tokens is found once the bridge starts; it
    exited 1, which a service manager restarts in a loop (the unit stops on 2)."""
    # (The run's own logging set up in this test process would stay for every
    # test after it: a handler on a closed capture, the root logger at INFO.)
    monkeypatch.setattr("bridge.commands.run.setup_logging", lambda *_args: None)
    (tmp_path / "sets").mkdir()
    data = {**GOOD, "sets": {"root": str(tmp_path / "sets")},
            "appservice": {"enabled": True, "listen": "127.0.0.1:0"}}
    assert main(["run", "-c", str(write(tmp_path, data))]) == 2


@pytest.mark.parametrize("key", ["access_token", "password"])
def test_the_examples_placeholder_left_in_a_credential_is_refused_naming_it(tmp_path, key):
    """config.example.yaml's access_token: "..." left beside a real password:
    the token is used first, Synapse fails on it (HTTP 500), and the bridge
    blamed homeserver.url."""
    raw = {**GOOD, "bot": {"user_id": "@askbot:example.org", key: "..."}}
    with pytest.raises(ConfigError, match=rf"bot\.{key}: '\.\.\.' is the example's placeholder"):
        parse_config(raw, base_dir=tmp_path, environ={})
