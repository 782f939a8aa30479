"""``make demo``: the bridge on the embedded default.

Starts a throwaway Synapse on 127.0.0.1:8008, or the next free port
(printed), with its data under ``.demo/``; registers the bridge and a
person, makes a room, copies the bundled example sets into ``.demo/ask``
and runs the bridge on them until Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import yaml

from bridge.devserver import Synapse, first_free_port
from bridge.resources import examples_dir
from bridge.service.config import load_config
from bridge.service.logs import setup_logging

PERSON_PASSWORD = "demo-password"
# Matrix's customary client port: the same URL every run while it is free.
DEMO_PORT = 8008


def command_path() -> str:
    """How to run ``askwright-bridge`` from the terminal ``make demo`` ran
    in: the virtualenv's own (not on the PATH unless activated)."""
    beside = Path(sys.executable).parent / "askwright-bridge"
    return os.path.relpath(beside) if beside.exists() else "askwright-bridge"


def showcase(examples: Path) -> list[str]:
    """One line per bundled question: where it is and what it shows.

    Read from the sets themselves, so the list never claims a feature a
    question does not have.
    """
    from bridge.service.posting.sets import load_set

    lines: list[str] = []
    for folder in sorted(p for p in examples.iterdir() if (p / "questions.json").is_file()):
        qset, _errors = load_set(folder)
        if qset is None:
            continue
        for number, q in enumerate(qset.questions, start=1):
            shows = [q.kind]
            if q.one_pager:
                shows.append("a one-pager in its thread (" + ", ".join(dict.fromkeys(b.type for b in q.one_pager)) + ")")
            for item in q.media or ():
                src = item.src or ""
                if src.endswith((".mp4", ".webm", ".mov")):
                    vtt = src.rsplit(".", 1)[0] + ".vtt"
                    captioned = any((folder / root / vtt).is_file() for root in (qset.media_roots or ["."]))
                    shows.append("a clip" + (" with captions" if captioned else ""))
                elif src:
                    shows.append("an image")
            if q.subject is not None:
                shows.append("an approval bound to a subject")
            expires = q.expires_for(qset)
            if expires is not None:
                shows.append(f"a deadline ({expires})")
            if q.quorum is not None:
                among = f"-of-{len(q.answerers)}" if q.answerers else ""
                veto = f", veto {', '.join(q.quorum.veto)}" if q.quorum.veto else ""
                shows.append(f"a {q.quorum.required}{among} approval{veto}")
            if q.escalate is not None:
                shows.append(f"escalation after {q.escalate.after}")
            lines.append(f"  {qset.title} \u00b7 {number}. {q.title}: {', '.join(shows)}")
    return lines


def main(base: Path = Path(".demo")) -> int:
    base = base.resolve()
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    sets_root = base / "ask"
    shutil.copytree(examples_dir(), sets_root)
    port = first_free_port(DEMO_PORT)
    synapse = Synapse(base / "synapse", port=port)
    taken = "" if port == DEMO_PORT else f" ({DEMO_PORT} is taken)"
    print(f"starting a local Synapse on port {port}{taken} in {synapse.data_dir} ...", flush=True)
    try:
        synapse.start()
        bot = synapse.register("askbot")
        person = synapse.register("person", password=PERSON_PASSWORD)
        room_id = synapse.create_room(bot["access_token"], invite=[person["user_id"]], name="Agent questions")
        synapse.join(person["access_token"], room_id)
        # The release-approval example's other release owners and its escalation, to log in as in a second client.
        for name in ("lead", "qa", "manager"):
            other = synapse.register(name, password=PERSON_PASSWORD)
            synapse.invite(bot["access_token"], room_id, other["user_id"])
            synapse.join(other["access_token"], room_id)
        config_path = base / "config.yaml"
        config_path.write_text(yaml.safe_dump({
            "homeserver": {"url": synapse.url},
            "bot": {"user_id": bot["user_id"], "access_token": bot["access_token"]},
            "sets": {"root": str(sets_root)},
            "rooms": {"default": room_id},
            "store": {"path": str(base / "bridge.sqlite")},
        }))
        os.chmod(config_path, 0o600)
        print(
            "\n  homeserver   {url}\n  log in as    {user} / {password} (or @lead, @qa, @manager: same password)\n  room         {room}\n"
            "  sets         {sets}\n  answers      {sets}/<set>/answers.json"
            "  ({cli} read {sets}/<set>)\n\nWhat each question shows:\n{shows}\n\n"
            "Ctrl-C stops the bridge and Synapse.\n".format(
                url=synapse.url, user=person["user_id"], password=PERSON_PASSWORD, room=room_id, sets=sets_root,
                cli=command_path(),
                shows="\n".join(showcase(sets_root))),
            flush=True,
        )
        setup_logging("INFO")
        from bridge.service.app import run_forever

        return run_forever(load_config(config_path))
    finally:
        synapse.stop()
        print("Synapse stopped.", flush=True)


if __name__ == "__main__":
    # Ctrl-C and SIGTERM are handled by the bridge's loop; this catches one
    # that lands before the loop is up.
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(0)
