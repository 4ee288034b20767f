"""Read the pixels of a PNG (8-bit RGB or RGBA, not interlaced: what Chromium's screenshots
are) with the standard library, so a browser test can look at what it screenshotted."""
from __future__ import annotations

import struct
import zlib


class Image:
    def __init__(self, png: bytes):
        if png[:8] != b"\x89PNG\r\n\x1a\n":
            raise ValueError("not a PNG")
        pos, data = 8, b""
        while pos < len(png):
            length, kind = struct.unpack(">I4s", png[pos:pos + 8])
            body = png[pos + 8:pos + 8 + length]
            if kind == b"IHDR":
                self.width, self.height, depth, color, _, _, interlace = struct.unpack(
                    ">IIBBBBB", body)
                if depth != 8 or color not in (2, 6) or interlace:
                    raise ValueError(f"unsupported PNG: depth {depth}, colour type {color}, "
                                     f"interlace {interlace}")
                self.channels = 3 if color == 2 else 4
            elif kind == b"IDAT":
                data += body
            pos += 12 + length
        self._raw = zlib.decompress(data)
        self._rows: list[bytearray] = []

    def _row(self, y: int) -> bytearray:
        """Row ``y``, unfiltered (rows are decoded up to the one asked for: each filter reads
        the row above it)."""
        stride, c = self.width * self.channels, self.channels
        while len(self._rows) <= y:
            n = len(self._rows)
            prev = self._rows[-1] if self._rows else bytearray(stride)
            f = self._raw[n * (stride + 1)]
            line = bytearray(self._raw[n * (stride + 1) + 1:(n + 1) * (stride + 1)])
            for i in range(stride):
                a = line[i - c] if i >= c else 0
                b = prev[i]
                up_left = prev[i - c] if i >= c else 0
                if f == 1:
                    line[i] = (line[i] + a) & 255
                elif f == 2:
                    line[i] = (line[i] + b) & 255
                elif f == 3:
                    line[i] = (line[i] + (a + b) // 2) & 255
                elif f == 4:
                    p = a + b - up_left
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - up_left)
                    pred = a if pa <= pb and pa <= pc else b if pb <= pc else up_left
                    line[i] = (line[i] + pred) & 255
            self._rows.append(line)
        return self._rows[y]

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        """(r, g, b) at integer CSS pixel (x, y) of a scale-1 screenshot."""
        i = x * self.channels
        r, g, b = self._row(y)[i:i + 3]
        return r, g, b


def hex_rgb(color: str) -> tuple[int, int, int]:
    color = color.lstrip("#")
    return int(color[0:2], 16), int(color[2:4], 16), int(color[4:6], 16)


def close(a: tuple[int, int, int], b: tuple[int, int, int], tol: int = 6) -> bool:
    return all(abs(x - y) <= tol for x, y in zip(a, b))
