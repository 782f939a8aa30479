"""Draw examples/release-decisions/media/latency.png: the example question's
chart, big enough to see what it asks about (standard library only).

A p95 latency line on staging: flat and low, a red deploy marker, then
about twice as high.  Run it from the source tree; it overwrites the file.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

WIDTH, HEIGHT = 640, 360
WHITE, GRID, AXIS, LINE, MARKER = (255, 255, 255), (226, 230, 236), (90, 96, 110), (30, 110, 200), (214, 40, 40)
LEFT, RIGHT, TOP, BOTTOM = 60, 610, 30, 320
DEPLOY_AT = 0.45  # of the time axis


def latency(x: float) -> float:
    """p95 latency (0..1 of the plot's height) at time ``x`` (0..1): a steady
    base with a little jitter, roughly doubling after the deploy."""
    jitter = 0.02 * ((int(x * 97) * 37) % 7 - 3) / 3
    base = 0.3 if x < DEPLOY_AT else 0.3 + 0.32 * min(1.0, (x - DEPLOY_AT) / 0.04)
    return base + jitter


def draw() -> bytes:
    pixels = [[WHITE] * WIDTH for _ in range(HEIGHT)]

    def dot(x: int, y: int, colour: tuple[int, int, int], size: int = 1) -> None:
        for dy in range(-(size // 2), size - size // 2):
            for dx in range(-(size // 2), size - size // 2):
                if 0 <= x + dx < WIDTH and 0 <= y + dy < HEIGHT:
                    pixels[y + dy][x + dx] = colour

    def line(x0: int, y0: int, x1: int, y1: int, colour: tuple[int, int, int], size: int = 1) -> None:
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for step in range(steps + 1):
            dot(round(x0 + (x1 - x0) * step / steps), round(y0 + (y1 - y0) * step / steps), colour, size)

    for fraction in (0.25, 0.5, 0.75, 1.0):  # horizontal grid
        y = round(BOTTOM - fraction * (BOTTOM - TOP))
        line(LEFT, y, RIGHT, y, GRID)
    line(LEFT, TOP, LEFT, BOTTOM, AXIS, 2)
    line(LEFT, BOTTOM, RIGHT, BOTTOM, AXIS, 2)
    deploy = round(LEFT + DEPLOY_AT * (RIGHT - LEFT))
    for y in range(TOP, BOTTOM, 8):  # the deploy marker, dashed
        line(deploy, y, deploy, min(y + 4, BOTTOM), MARKER, 3)
    previous = None
    for x in range(LEFT, RIGHT + 1, 4):
        y = round(BOTTOM - latency((x - LEFT) / (RIGHT - LEFT)) * (BOTTOM - TOP))
        if previous:
            line(*previous, x, y, LINE, 4)
        previous = (x, y)
    return png(pixels)


def png(pixels: list[list[tuple[int, int, int]]]) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\x00" + bytes(c for pixel in row for c in pixel) for row in pixels)
    header = struct.pack(">IIBBBBB", len(pixels[0]), len(pixels), 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b""))


if __name__ == "__main__":
    target = Path(__file__).resolve().parents[1] / "examples" / "release-decisions" / "media" / "latency.png"
    target.write_bytes(draw())
    print(f"wrote {target} ({WIDTH}x{HEIGHT})")
