"""A small flame graph (SVG) from py-spy's raw output (``py-spy record -f raw``: one line per
stack, ``frame;frame;... count``), cut at one frame, so that it shows one path alone.

    python -m bench._flame raw.txt --root later_batch -o flame.svg [--title ...]

Only stacks through a frame containing ``--root`` are kept, drawn from that frame up;
frames are named ``function (file)`` without directories or line numbers, boxes narrower than
``--min`` of the root are left out (so the file stays small); hovering a box shows its
name, samples and share of the root.
"""

from __future__ import annotations

import argparse
import html
import re
from dataclasses import dataclass, field

_WIDTH, _ROW = 1200, 16


@dataclass
class _Node:
    count: int = 0
    children: dict[str, _Node] = field(default_factory=dict)


def _short(frame: str) -> str:
    """``function (path/to/file.py:12)`` -> ``function (file.py)``: one box per function,
    whatever line of it a sample was on."""
    return re.sub(r"\((?:[^()]*/)?([^()/:]+)(?::\d*)?\)$", r"(\1)", frame.strip())


def read(path: str, root: str) -> _Node:
    tree = _Node()
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            cut = [i for i, f in enumerate(frames) if root in f]
            if not cut or not count.isdigit():
                continue
            tree.count += int(count)
            node = tree
            for frame in frames[cut[0] :]:
                node = node.children.setdefault(_short(frame), _Node())
                node.count += int(count)
    return tree


def _color(name: str) -> str:
    h = sum(map(ord, name))
    if ".so" in name or "(?)" in name or "(" not in name:  # native code
        return f"rgb({200 + h % 50},{120 + h % 60},{60 + h % 40})"
    return f"rgb({230 + h % 25},{150 + h % 80},{40 + h % 50})"


def render(tree: _Node, title: str, minimum: float) -> str:
    total = max(tree.count, 1)
    boxes: list[str] = []
    depth_seen = [0]

    def draw(name: str, node: _Node, x: float, depth: int) -> None:
        width = _WIDTH * node.count / total
        if node.count / total < minimum:
            return
        depth_seen[0] = max(depth_seen[0], depth)
        label = html.escape(name)
        share = 100 * node.count / total
        text = label if width > 7 * len(name) else label[: max(0, int(width / 7) - 2)] + ".."
        boxes.append(
            f"<g><title>{label}: {node.count} samples, {share:.1f}%</title>"
            f'<rect x="{x:.1f}" y="{{y{depth}}}" width="{width:.1f}" height="{_ROW - 1}" '
            f'fill="{_color(name)}"/>'
            + (f'<text x="{x + 3:.1f}" y="{{t{depth}}}">{text}</text>' if width > 21 else "")
            + "</g>"
        )
        for child_name, child in sorted(node.children.items()):
            draw(child_name, child, x, depth + 1)
            x += _WIDTH * child.count / total

    x = 0.0
    for name, child in sorted(tree.children.items()):
        draw(name, child, x, 0)
        x += _WIDTH * child.count / total
    rows = depth_seen[0] + 1
    height = rows * _ROW + 40
    body = "\n".join(boxes)
    for depth in range(rows):  # the root at the bottom, callees above
        y = height - 10 - (depth + 1) * _ROW
        body = body.replace(f"{{y{depth}}}", str(y)).replace(f"{{t{depth}}}", str(y + 11))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
        f'font-family="monospace" font-size="11">\n'
        f'<text x="4" y="16" font-size="13">{html.escape(title)} ({tree.count} samples; '
        f"boxes under {minimum:.1%} left out)</text>\n{body}\n</svg>\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw")
    parser.add_argument("--root", required=True)
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--title", default="")
    parser.add_argument("--min", type=float, default=0.004)
    args = parser.parse_args()
    tree = read(args.raw, args.root)
    with open(args.output, "w", encoding="utf-8") as out:
        out.write(render(tree, args.title or args.root, args.min))


if __name__ == "__main__":
    main()
