"""``generate-registration``: the registration, tokens generated once and
stored in the config (comments kept where the layout allows), modes 0600."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import yaml

from bridge.cli import main

BASE = """\
# my bridge
homeserver:
  url: "http://127.0.0.1:8008"   # local
bot:
  user_id: "@askbot:example.org"
sets:
  root: "./ask"
rooms:
  default: "!room"
store:
  path: "./bridge.sqlite"
"""


def generate(tmp_path: Path, text: str) -> tuple[dict, dict, str]:
    config = tmp_path / "config.yaml"
    config.write_text(text)
    out = tmp_path / "registration.yaml"
    assert main(["generate-registration", "-c", str(config), "-o", str(out)]) == 0
    for path in (config, out):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    after = config.read_text()
    return yaml.safe_load(out.read_text()), yaml.safe_load(after), after


def test_tokens_are_generated_stored_and_comments_kept(tmp_path):
    text = BASE + "appservice:\n  enabled: true\n  # the tokens:\n  # as_token: \"...\"\n# trailing comment\n"
    reg, config, after = generate(tmp_path, text)
    assert "# my bridge" in after and "# local" in after and "# trailing comment" in after
    settings = config["appservice"]
    assert len(settings["as_token"]) == 64 and len(settings["hs_token"]) == 64
    assert settings["as_token"] != settings["hs_token"]
    assert (reg["as_token"], reg["hs_token"]) == (settings["as_token"], settings["hs_token"])
    assert after.index("as_token: \"" + settings["as_token"]) < after.index("# trailing comment")
    assert reg["sender_localpart"] == "askbot" and reg["rate_limited"] is False
    assert reg["id"] == "askwright" and reg["url"] == "http://127.0.0.1:29331"
    users = reg["namespaces"]["users"]
    assert all(ns["exclusive"] for ns in users)
    assert any(re.fullmatch(ns["regex"], "@askbot:example.org") for ns in users)
    assert reg["namespaces"]["rooms"] == [] and reg["namespaces"]["aliases"] == []


def test_existing_tokens_are_used_and_the_config_left_alone(tmp_path):
    text = BASE + "appservice:\n  enabled: true\n  as_token: \"A\" # keep\n  hs_token: \"H\"\n"
    reg, _config, after = generate(tmp_path, text)
    assert (reg["as_token"], reg["hs_token"]) == ("A", "H")
    assert after == text


def test_an_empty_key_is_filled_in_place_and_a_missing_section_added(tmp_path):
    _reg, config, after = generate(tmp_path, BASE + "appservice:\n    enabled: true\n    hs_token:\n")
    assert config["appservice"]["enabled"] is True and config["appservice"]["hs_token"]
    assert after.count("hs_token") == 1
    with_token = BASE.replace('user_id: "@askbot', 'access_token: "t"\n  user_id: "@askbot')
    _reg, config, after = generate(tmp_path, with_token)
    assert config["appservice"]["as_token"] and after.startswith("# my bridge")


def test_a_layout_the_edit_cannot_handle_is_rewritten_whole(tmp_path, capsys):
    _reg, config, after = generate(tmp_path, BASE + "appservice: {enabled: true, id: mine}\n")
    assert config["appservice"]["enabled"] is True and config["appservice"]["id"] == "mine"
    assert config["appservice"]["as_token"] and config["homeserver"]["url"] == "http://127.0.0.1:8008"
    assert "comments in it were lost" in capsys.readouterr().err


def test_with_encryption_the_registration_asks_for_the_appservice_extensions(tmp_path):
    reg, _config, _after = generate(tmp_path, BASE + "appservice:\n  enabled: true\n")
    assert (reg["receive_ephemeral"], reg["org.matrix.msc3202"]) == (True, True)
    plain = tmp_path / "plain"
    plain.mkdir()
    reg, _config, _after = generate(plain, BASE + "encryption:\n  enabled: false\nappservice:\n  enabled: true\n")
    assert "receive_ephemeral" not in reg and "org.matrix.msc3202" not in reg


def test_the_namespace_synapse_loads_claims_this_servers_users_and_no_other_servers(tmp_path):
    """Synapse matches a user namespace from the start of the id only: the
    registration's ``@askbot:example\\.org`` also claimed
    ``@askbot:example.org-other.net``, and Synapse pushed the bridge what
    such a user of another server said in any room Synapse saw.  The
    registration as Synapse itself loads and matches it."""
    from synapse.config.appservice import load_appservices

    from bridge.service.config import load_config
    from bridge.service.transport.appservice import AppserviceFront

    generate(tmp_path, BASE + "appservice:\n  enabled: true\n")
    (service,) = load_appservices("example.org", [str(tmp_path / "registration.yaml")])
    ours = ["@askbot:example.org", "@askwright_alice:example.org", "@askwright_:example.org"]
    others = ["@askbot:example.org-other.net", "@askbot:example.org.evil", "@askwright_x:example.organic.net",
              "@askwright_x:other.net:example.org", "@askbotx:example.org", "@askbot:exampleXorg",
              "@xaskwright_y:example.org"]
    assert [u for u in ours if not service.is_interested_in_user(u)] == []
    assert [u for u in others if service.is_interested_in_user(u) or service.is_exclusive_user(u)] == []
    # The bridge tells its own users by the same namespace.
    front = AppserviceFront(load_config(tmp_path / "config.yaml"), store=None)  # type: ignore[arg-type]
    assert [u for u in ours if not front.own_user(u)] == [] and [u for u in others if front.own_user(u)] == []
