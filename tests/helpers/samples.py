"""Real files at real sizes for the tests: a PNG of random pixels (a
screenshot that does not compress) and an H.264 clip made by ffmpeg."""

from __future__ import annotations

import os
import struct
import subprocess
import zlib
from pathlib import Path


def noisy_png(width: int = 800, height: int = 600) -> bytes:
    """A valid RGB PNG whose pixels are random: about width*height*3 bytes (800x600: 1.4 MB)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + os.urandom(width * 3) for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows, 1)) + chunk(b"IEND", b""))


def clip_mp4(path: Path, seconds: int = 9, bitrate: str = "18M") -> bytes:
    """A 720p H.264 clip of ffmpeg's test picture under noise, at a constant
    bitrate (the encoder pads what it saves): 9 s at 18 Mbit/s is 20 MB."""
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi",
                    "-i", "testsrc=size=1280x720:rate=25,noise=alls=60:allf=t", "-t", str(seconds),
                    "-c:v", "libx264", "-preset", "ultrafast", "-b:v", bitrate, "-minrate", bitrate, "-maxrate", bitrate, "-bufsize", "2M", "-x264-params", "nal-hrd=cbr",
                    "-pix_fmt", "yuv420p", "-movflags", "+faststart", str(path)], check=True, timeout=120)
    return path.read_bytes()
