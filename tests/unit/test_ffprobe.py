"""ffprobe runs on anyone's file (a person's, an agent's): a "video" that
is a playlist naming URLs must not make the bridge fetch them, whatever
ffprobe's version allows by itself; a real clip still probes."""

from __future__ import annotations

import http.server
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from bridge.questionset.setdir import ffprobe
from bridge.service.posting import media

needs_ffmpeg = pytest.mark.skipif(shutil.which("ffprobe") is None or shutil.which("ffmpeg") is None,
                                  reason="ffmpeg is not on the PATH")


def test_the_command_lets_in_only_local_files_and_names_the_file_as_one(tmp_path):
    from bridge.questionset.media import ffprobe_command

    command = ffprobe_command("/usr/bin/ffprobe", "stream=codec_name", "-odd:name.mp4")
    at = command.index("-protocol_whitelist")
    assert command[at + 1] == "file" and at < len(command) - 1
    assert command[-1] == "file:" + str(Path("-odd:name.mp4").absolute())


def test_both_probes_run_that_command(tmp_path, monkeypatch):
    # The lint's codec probe and the posting's size probe each built their own
    # command line, neither limiting what ffprobe may open.
    ran: list[list[str]] = []

    def run(command, **_kwargs):
        ran.append(command)
        return subprocess.CompletedProcess(command, 0, b"{}", b"")

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(media.shutil, "which", lambda _name: "/usr/bin/ffprobe")
    clip = str(tmp_path / "clip.mp4")
    ffprobe("/usr/bin/ffprobe")(clip)
    media.probe(clip)
    assert [command[:6] for command in ran] == [["/usr/bin/ffprobe", "-v", "error", "-protocol_whitelist", "file",
                                                 "-show_entries"]] * 2
    assert [command[-1] for command in ran] == ["file:" + clip] * 2


@needs_ffmpeg
def test_a_playlist_posing_as_a_clip_fetches_nothing_and_a_real_clip_still_probes(tmp_path):
    asked: list[str] = []

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the handler's name is http.server's)
            asked.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *_args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        playlist = tmp_path / "take.mp4"
        playlist.write_text(f"#EXTM3U\n#EXT-X-MEDIA-SEQUENCE:0\n#EXTINF:10.0,\n"
                            f"http://127.0.0.1:{server.server_address[1]}/internal/seg.ts\n#EXT-X-ENDLIST\n")
        assert ffprobe(shutil.which("ffprobe"))(str(playlist)) is None
        assert media.probe(str(playlist)) == (None, None, None)
        assert asked == []
    finally:
        server.shutdown()
        server.server_close()
    clip = tmp_path / "clip.mp4"
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc=size=320x240:rate=25", "-t", "1",
                    "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", str(clip)], check=True, timeout=60)
    streams = ffprobe(shutil.which("ffprobe"))(str(clip))
    assert streams is not None and streams.video == ("h264",)
    assert media.probe(str(clip)) == (320, 240, 1000)
