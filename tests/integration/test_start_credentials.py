"""What an operator is told when the bot's credentials can't be used, at a
real Synapse: a wrong homeserver.url is not a refused token, and a token of
another account is not run with as if it were the bot's."""

from __future__ import annotations

import select
import subprocess
import time
import sys

import pytest
import yaml

from helpers.harness import unique

pytestmark = pytest.mark.integration


def run(tmp_path, url: str, user_id: str, token: str) -> subprocess.CompletedProcess:
    (tmp_path / "sets").mkdir(exist_ok=True)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "homeserver": {"url": url}, "bot": {"user_id": user_id, "access_token": token},
        "sets": {"root": str(tmp_path / "sets")}, "rooms": {"default": "!nowhere:localhost"},
        "store": {"path": str(tmp_path / "bridge.sqlite")}}))
    config.chmod(0o600)
    return subprocess.run([sys.executable, "-m", "bridge", "run", "-c", str(config)], capture_output=True,
                          text=True, timeout=60)


def test_a_wrong_homeserver_url_is_said_to_be_the_url_not_the_token(synapse, tmp_path):
    bot = synapse.register(unique("askbot"))
    result = run(tmp_path, synapse.url + "/wrong", bot["user_id"], bot["access_token"])
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "check homeserver.url" in output and "HTTP 404" in output, output
    assert "access token was refused" not in output


def test_a_token_of_another_account_is_refused_naming_both(synapse, tmp_path):
    bot, other = synapse.register(unique("askbot")), synapse.register(unique("someone"))
    result = run(tmp_path, synapse.url, bot["user_id"], other["access_token"])
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert f"the access token belongs to {other['user_id']}, not to bot.user_id {bot['user_id']}" in output, output


def test_https_to_a_plain_http_homeserver_is_said_within_seconds_naming_the_url(synapse, tmp_path, monkeypatch):
    """nio retries a failed TLS handshake for ever, in silence: the log said
    nothing for 40 s and more."""
    bot = synapse.register(unique("askbot"))
    url = synapse.url.replace("http://", "https://")
    (tmp_path / "sets").mkdir()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "homeserver": {"url": url}, "bot": {"user_id": bot["user_id"], "access_token": bot["access_token"]},
        "sets": {"root": str(tmp_path / "sets")}, "rooms": {"default": "!nowhere:localhost"},
        "store": {"path": str(tmp_path / "bridge.sqlite")}}))
    config.chmod(0o600)
    process = subprocess.Popen([sys.executable, "-m", "bridge", "run", "-c", str(config)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        lines: list[str] = []
        while time.monotonic() < deadline:
            # (readline alone would wait for ever on a bridge that says nothing)
            ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            line = process.stdout.readline()
            lines.append(line)
            if "has not answered" in line or not line:
                break
        assert any(f"the homeserver at {url} has not answered" in line and "homeserver.url" in line
                   for line in lines), "".join(lines)
    finally:
        process.terminate()
        process.wait(timeout=30)


async def test_a_token_revoked_while_the_bridge_runs_stops_it_saying_so(bridge):
    """The bot's session signed out (its token revoked) while the bridge ran:
    it retried every 30 s for ever, /health ready, the only sign a homeserver
    'silent' that was answering with a refusal, and no answer recorded."""
    from bridge.devserver import _http_json
    from helpers.attack import text_set
    from helpers.harness import answer_content

    bridge.add_set(text_set("revoked", 2))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, 2)
    await bridge.alice.send(bridge.room_id, answer_content(questions[("q0", 1)], text="before"))
    await bridge.wait_answer("revoked", "q0")
    _http_json("POST", f"{bridge.synapse.url}/_matrix/client/v3/logout", {}, bridge.bot["access_token"])
    try:
        code = bridge.process.wait(60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the bridge ran on with its token refused\n{bridge.log_text()[-2000:]}") from None
    assert code == 1
    assert "refused the bridge's access token while it ran (M_UNKNOWN_TOKEN)" in bridge.log_text()
