"""The fleet replay's plot: a PNG of the nodes each policy kept cordoned and of the jobs' progress, over time.

Owns a small raster (`Canvas`: lines, boxes, a 5x7 bitmap font) and a PNG encoder on the standard
library (zlib), so the plot needs no plotting package, and `plot(figures, path)`: two panels sharing
the time axis (days): nodes cordoned by the policy or a person, and the training kept by the largest
job (hours), one colour per policy, with the ideal (every hour kept) dotted. Text is upper case.
Fails with `OSError` when the file cannot be written.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence

from kcover.sim.fleet import report

Colour = tuple[int, int, int]
COLOURS: dict[str, Colour] = {"kcover": (214, 39, 40), "kubernetes": (127, 127, 127), "go": (31, 119, 180),
                              "oracle": (44, 160, 44)}
INK: Colour = (30, 30, 30)
GRID: Colour = (225, 225, 225)

_FONT = {
    "0": "01110100011001110101110011000101110", "1": "00100011000010000100001000010001110",
    "2": "01110100010000100010001000100011111", "3": "11110000010000101110000010000111110",
    "4": "00010001100101010010111110001000010", "5": "11111100001111000001000011000101110",
    "6": "00110010001000011110100011000101110", "7": "11111000010001000100010000100001000",
    "8": "01110100011000101110100011000101110", "9": "01110100011000101111000010001001100",
    "A": "01110100011000111111100011000110001", "B": "11110100011000111110100011000111110",
    "C": "01110100011000010000100001000101110", "D": "11100100101000110001100011001011100",
    "E": "11111100001000011110100001000011111", "F": "11111100001000011110100001000010000",
    "G": "01110100011000010111100011000101111", "H": "10001100011000111111100011000110001",
    "I": "01110001000010000100001000010001110", "J": "00111000100001000010000101001001100",
    "K": "10001100101010011000101001001010001", "L": "10000100001000010000100001000011111",
    "M": "10001110111010110101100011000110001", "N": "10001100011100110101100111000110001",
    "O": "01110100011000110001100011000101110", "P": "11110100011000111110100001000010000",
    "Q": "01110100011000110001101011001001101", "R": "11110100011000111110101001001010001",
    "S": "01111100001000001110000010000111110", "T": "11111001000010000100001000010000100",
    "U": "10001100011000110001100011000101110", "V": "10001100011000110001100010101000100",
    "W": "10001100011000110101101011010101010", "X": "10001100010101000100010101000110001",
    "Y": "10001100010101000100001000010000100", "Z": "11111000010001000100010001000011111",
    " ": "0" * 35, ".": "00000000000000000000000000110001100", "-": "00000000000000011111000000000000000",
    ":": "00000011000110000000011000110000000", "%": "11000110010001000100010001001100011",
    "(": "00010001000100001000010000010000010", ")": "01000001000001000010000100010001000",
    "/": "00000000010001000100010001000000000", ",": "00000000000000000000001100010001000",
    "+": "00000001000010011111001000010000000",
}


class Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def dot(self, x: int, y: int, colour: Colour) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.pixels[i:i + 3] = bytes(colour)

    def line(self, x0: int, y0: int, x1: int, y1: int, colour: Colour, *, dotted: bool = False) -> None:
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err, n = dx + dy, 0
        while True:
            if not dotted or n % 6 < 3:
                self.dot(x0, y0, colour)
                self.dot(x0, y0 + 1, colour)
            n += 1
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err, x0 = err + dy, x0 + sx
            if e2 <= dx:
                err, y0 = err + dx, y0 + sy

    def text(self, x: int, y: int, words: str, colour: Colour = INK) -> None:
        for ch in words.upper():
            glyph = _FONT.get(ch, _FONT[" "])
            for k, bit in enumerate(glyph):
                if bit == "1":
                    self.dot(x + k % 5, y + k // 5, colour)
            x += 6

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.pixels[y * self.width * 3:(y + 1) * self.width * 3])
                       for y in range(self.height))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def _panel(canvas: Canvas, box: tuple[int, int, int, int], series: Mapping[str, Sequence[tuple[float, float]]], *,
           days: float, title: str, step: bool, ideal: float | None = None) -> None:
    left, top, right, bottom = box
    peak = max([v for s in series.values() for _, v in s] + [ideal or 0.0, 1.0])
    canvas.text(left, top - 14, title)
    for k in range(5):
        y = bottom - (bottom - top) * k // 4
        canvas.line(left, y, right, y, GRID)
        canvas.text(left - 8 - 6 * len(f"{peak * k / 4:.0f}"), y - 3, f"{peak * k / 4:.0f}")
    for d in range(int(days) + 1):
        if days <= 14 or d % 7 == 0:
            x = left + int((right - left) * d / days)
            canvas.line(x, top, x, bottom, GRID)
            canvas.text(x - 3 * len(str(d)), bottom + 6, str(d))
    canvas.line(left, bottom, right, bottom, INK)
    canvas.line(left, top, left, bottom, INK)

    def xy(t: float, v: float) -> tuple[int, int]:
        return left + int((right - left) * t / (days * 86400)), bottom - int((bottom - top) * v / peak)

    if ideal is not None:
        canvas.line(*xy(0, 0), *xy(days * 86400, ideal), INK, dotted=True)
    for name, points in series.items():
        colour = COLOURS.get(name, INK)
        last: tuple[int, int] | None = None
        for t, v in points:
            here = xy(t, v)
            if last is not None:
                if step:
                    canvas.line(last[0], last[1], here[0], last[1], colour)
                    canvas.line(here[0], last[1], here[0], here[1], colour)
                else:
                    canvas.line(*last, *here, colour)
            last = here
        if last is not None and step:
            canvas.line(last[0], last[1], right, last[1], colour)


def plot(figs: Mapping[str, report.Figures], path: str, *, days: float, job: str) -> None:
    canvas = Canvas(1000, 720)
    canvas.text(70, 12, f"KCOVER SIM FLEET: {days:g} DAYS, DAYS ON THE X AXIS")
    cordoned = {name: fig.cordoned_series for name, fig in figs.items()}
    _panel(canvas, (70, 60, 960, 330), cordoned, days=days, title="NODES CORDONED (BY THE POLICY OR A PERSON)",
           step=True)
    progress = {name: [(t, v / 3600) for t, v in fig.progress.get(job, [])] for name, fig in figs.items()}
    _panel(canvas, (70, 400, 960, 670), progress, days=days, step=False, ideal=days * 24,
           title=f"TRAINING KEPT BY {job} (HOURS; DOTTED: ALL OF IT)")
    x = 70
    for name in figs:
        canvas.line(x, 700, x + 20, 700, COLOURS.get(name, INK))
        canvas.text(x + 26, 697, name)
        x += 40 + 6 * len(name)
    with open(path, "wb") as out:
        out.write(canvas.png())
