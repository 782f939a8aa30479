"""The mend operators.md gives for a corrupt answers.json: move it aside.
The next write made the file anew from the questions waiting to be written
alone: every answer accepted before was gone from it (a restart did not
bring them back, and verify named each as missing)."""

from __future__ import annotations

import copy
import json

from bridge.protocol.recorded import RecordedQuestion
from helpers.timeline import Room, answer

ANA, BO = "@alice:hs", "@bob:hs"
T0 = 1_800_000_000_000


def test_an_answers_json_moved_aside_is_written_anew_whole(tmp_path):
    room = Room(tmp_path)
    content = copy.deepcopy(room.posted.content)
    content["question"]["id"], content["elicitation_id"] = "other", "elc_other"
    other = RecordedQuestion(event_id="$q_other", room_id=room.posted.room_id, set_id="kinds", content=content)
    with room.store.transaction():
        room.store.record_posted(other, set_dir=str(room.set_dir), posted_at=1)
    room.deliver([answer("$a1", ANA, T0 + 1000, "main")])
    path = room.set_dir / "answers.json"
    path.write_text("{ not json")  # corrupt: the next write holds the set back
    late = answer("$b1", BO, T0 + 2000, "stable")
    late["content"]["elicitation_id"], late["content"]["m.relates_to"]["event_id"] = "elc_other", "$q_other"
    room.deliver([late])
    assert room.store.held_sets()
    path.rename(room.set_dir / "answers.json.broken")  # the operator's mend
    room.crash()  # a start tries every held set at once
    room.pipeline.flush()
    answers = json.loads(path.read_text())["answers"]
    assert sorted(answers) == ["branch", "other"], answers
    assert answers["branch"]["choice"] == "main" and answers["other"]["choice"] == "stable"
