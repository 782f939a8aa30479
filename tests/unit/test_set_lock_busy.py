"""A writer paused while it holds a set's lock (a former leader frozen by
SIGSTOP in the middle of writing answers.json) must not stall the bridge:
seen in the failover storm, where the new leader's event loop waited on
the frozen one's flock, answered no /health and made nothing durable.  The
set is held back, its answers kept in the store, and written once the lock
is free."""

from __future__ import annotations

import fcntl
import os
import threading

from bridge.service.answering.folderflush import LOCK_BUSY_PROBLEM
from helpers.timeline import Room, answer

ANA = "@alice:hs"
T0 = 1_800_000_000_000


def test_a_lock_held_by_a_paused_writer_holds_the_set_back_and_the_answer_lands_once_it_is_free(tmp_path):
    room = Room(tmp_path)
    fd = os.open(room.set_dir / ".answers.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the frozen writer's lock: it never lets go by itself
    try:
        delivered = threading.Thread(target=room.deliver, args=([answer("$a1", ANA, T0 + 1000, "main")],),
                                     daemon=True)
        delivered.start()
        delivered.join(timeout=30)
        assert not delivered.is_alive(), "the flush waited for the paused writer's lock"
        assert room.record() is None  # not written yet, and not lost:
        ((_dir, _set, reason, _since, _attempts, _next),) = room.store.held_sets()
        assert reason == LOCK_BUSY_PROBLEM
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    # The writer ran again and let go: the next try writes the answer.
    room.crash()  # a start tries every held set at once
    room.pipeline.flush()
    assert room.record()["choice"] == "main"
    assert room.store.held_sets() == []
