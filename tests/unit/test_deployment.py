"""Deployment files: the systemd unit, the Dockerfile, the operator guide, the documented config."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from bridge.cli import main
from bridge.service.storage.store import SCHEMA_VERSION, Store

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "contrib" / "askwright-bridge.service"
DOCKERFILE = ROOT / "Dockerfile"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def unit_settings() -> dict[str, list[str]]:
    """Key -> every value it is given, across sections (systemd allows repeats)."""
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        settings.setdefault(key.strip(), []).append(value.strip())
    return settings


# -- systemd ---------------------------------------------------------------------------


def test_the_unit_runs_the_bridge_as_a_dedicated_user_and_restarts_on_failure():
    s = unit_settings()
    assert s["User"] == ["askwright"] and s["Group"] == ["askwright"]
    assert s["ExecStart"][0].endswith("askwright-bridge run -c /etc/askwright-bridge/config.yaml")
    assert s["Restart"] == ["on-failure"]
    assert s["RestartPreventExitStatus"] == ["2"]  # a refused config is not fixed by restarting
    assert s["WantedBy"] == ["multi-user.target"]


def test_the_unit_is_hardened():
    s = unit_settings()
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
                       "PrivateTmp": "yes", "PrivateDevices": "yes", "RestrictSUIDSGID": "yes",
                       "ProtectKernelTunables": "yes", "ProtectControlGroups": "yes"}.items():
        assert s[key] == [value], key
    assert s["CapabilityBoundingSet"] == [""]  # no capabilities at all
    assert "@system-service" in s["SystemCallFilter"]
    # Writable: only the store's folder and the sets.
    writable = s["ReadWritePaths"][0].split()
    assert "/var/lib/askwright-bridge" in writable and len(writable) == 2


def test_the_unit_parses_as_an_ini_file_with_the_three_sections():
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string(UNIT.read_text())
    assert parser.sections() == ["Unit", "Service", "Install"]


def test_systemd_analyze_verify_passes_else_the_content_checks_stand_in(tmp_path):
    """`systemd-analyze verify` on the unit as shipped, with ExecStart pointed
    at a stand-in executable (the bridge is not installed system-wide on a
    test machine and verify insists the binary exists).  Where the tool is
    absent, or fails without a word about this unit (a sandbox without
    systemd's runtime), the content checks above are the check."""
    if SYSTEMD_ANALYZE is None:
        assert unit_settings()["ExecStart"]  # nothing more can be run here; the content tests cover the unit
        return
    stand_in = tmp_path / "askwright-bridge"
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    exec_path = unit_settings()["ExecStart"][0].split()[0]
    unit = tmp_path / "askwright-bridge.service"
    unit.write_text(UNIT.read_text().replace(exec_path, str(stand_in)))
    done = subprocess.run([SYSTEMD_ANALYZE, "verify", str(unit)], capture_output=True, text=True, cwd=tmp_path,
                          timeout=60)
    output = done.stdout + done.stderr
    problems = [line for line in output.splitlines() if "askwright-bridge.service" in line]
    assert not problems, output
    if done.returncode != 0:
        # Nothing said about the unit: the environment, not the unit, failed.
        assert unit_settings()["ExecStart"], output


# -- Docker ----------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_dockerfile_builds_from_python_311_slim_and_runs_the_bridge_as_non_root():
    """No docker engine on the test machine: the Dockerfile's content is checked
    (and its build context below) instead of building the image."""
    instructions = dockerfile_instructions()
    words = [w for w, _ in instructions]
    assert instructions[0] == ("FROM", "python:3.11-slim")
    run = " ".join(rest for word, rest in instructions if word == "RUN")
    assert "pip install --no-cache-dir ." in run
    users = [rest for word, rest in instructions if word == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert "useradd" in run and users[-1] in run
    assert ("VOLUME", "/data") in instructions
    assert ("ENTRYPOINT", '["askwright-bridge"]') in instructions
    assert ("CMD", '["run", "-c", "/data/config.yaml"]') in instructions
    # The USER switch comes after the install and before the entry point.
    assert words.index("USER") > max(i for i, w in enumerate(words) if w == "RUN")
    assert words.index("USER") < words.index("ENTRYPOINT")


def test_the_docker_build_context_is_enough_to_build_the_package(tmp_path):
    """What the Dockerfile COPYs, and only that, builds a wheel that carries the schemas."""
    context = tmp_path / "context"
    context.mkdir()
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for word, rest in dockerfile_instructions():
        if word != "COPY" or rest.startswith("--from"):
            continue
        *sources, _target = rest.split()
        for source in sources:
            assert source not in ignored, f"{source} is copied but .dockerignore keeps it out"
            path = ROOT / source
            if path.is_dir():
                shutil.copytree(path, context / source, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(path, context / source)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(context)], check=True, timeout=300)
    import zipfile

    wheel = next((tmp_path / "dist").glob("askwright_bridge-*.whl"))
    assert "bridge/_data/schemas/matrix/dev.superpipeline.question.answer.v2.json" in zipfile.ZipFile(wheel).namelist()


def test_dockerignore_keeps_secrets_and_local_state_out():
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", "config.yaml", "*.sqlite", "tests", "*.crypto", "*.cross-signing.json"):
        assert entry in ignored


# -- docs and config -------------------------------------------------------------------


def test_the_operator_guide_covers_what_operators_need():
    guide = (ROOT / "docs" / "operators.md").read_text()
    for heading in ("## Install", "## Configure", "## Bot mode or appservice mode", "## Metrics and health",
                    "## Status, and waiting for answers", "## Management commands", "## Reminders", "## Upgrade",
                    "## Backup"):
        assert heading in guide
    for words in ("contrib/askwright-bridge.service", "Dockerfile", "/metrics", "/health", "!ask close",
                  "newer", ".backup"):
        assert words in guide


def test_the_example_config_documents_metrics_and_reminders_with_every_key_commented():
    text = (ROOT / "config.example.yaml").read_text()
    data = yaml.safe_load(text)
    assert data["metrics"] == {"enabled": False, "listen": "127.0.0.1:9464"}
    assert data["reminders"] == {"enabled": False, "after": "24h", "every": "24h"}
    lines = text.splitlines()
    for section in ("metrics", "reminders"):
        start = lines.index(f"{section}:")
        body = []
        for line in lines[start + 1:]:
            if line and not line.startswith(" "):
                break
            body.append(line)
        for i, line in enumerate(body):
            if line.strip() and not line.strip().startswith("#"):
                assert body[i - 1].strip().startswith("#"), f"{section}: {line.strip()} has no comment"


# -- upgrades ---------------------------------------------------------------------------


def test_run_refuses_a_store_from_a_newer_bridge_with_one_line_and_exit_2(tmp_path, capsys, store_backend):
    store_path = tmp_path / "bridge.sqlite"
    store = Store(store_path)
    store.db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    store.close()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "homeserver": {"url": "http://127.0.0.1:9"}, "bot": {"user_id": "@a:hs", "access_token": "t"},
        "sets": {"root": "."}, "rooms": {"default": "!r"}, "store": {"path": "./bridge.sqlite"},
    }))
    config.chmod(0o600)
    assert main(["run", "-c", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "newer askwright-bridge" in err and f"store schema {SCHEMA_VERSION + 1}" in err
