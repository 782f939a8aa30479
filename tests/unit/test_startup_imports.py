"""Start-up: what the bridge loads before its first sync (issue: start-up).

The first sync, and the answers waiting in it, need the config, the store,
the pipeline and matrix-nio; posting, the linter, the question-set models
(pydantic), the metrics' HTTP server, cross-signing's cryptography and
appservice mode load where they are first used.  A fresh interpreter shows
what importing the run command and the service pulls in.
"""

from __future__ import annotations

import json
import subprocess
import sys

NOT_BEFORE_THE_FIRST_SYNC = [
    "pydantic",  # the question-set models: loaded when a set is read
    "bridge.questionset.model",
    "bridge.questionset.lint",
    "bridge.service.posting.poster",
    "bridge.service.posting.media",
    "bridge.service.transport.appservice",  # only in appservice mode
    "bridge.service.operators.setstatus",  # only for status commands
    "aiohttp.web",  # only when something is served
    "cryptography",  # only when the bridge signs or checks a cross-signature
]


def loaded_by_the_run_path() -> set[str]:
    code = ("import json, sys; import bridge.commands.run, bridge.service.app; "
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


def test_the_run_path_loads_nothing_the_first_sync_does_not_need():
    loaded = loaded_by_the_run_path()
    assert [name for name in NOT_BEFORE_THE_FIRST_SYNC if name in loaded] == []
    assert {"nio", "bridge.service.answering.pipeline", "bridge.service.storage.store", "bridge.service.transport.bot"} <= loaded
