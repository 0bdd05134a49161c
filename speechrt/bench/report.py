"""`speechrt bench report a.json b.json ... --out report.html [--markdown docs/benchmarks.md]`: merge result
files of several machines or commits into one page.

Per family, a table with one row per measurement (engine, device, workload, metric) and, per run, its
value with the spread of its repeats, the ratio to the peer measured in that run, and the ratio to the
chosen baseline run (--baseline). Every ratio reads "times better": above 1 means faster than the peer
or the baseline, whether the metric is a time (lower is better) or a throughput. Each family has a chart
(plots.py), saved as a PNG beside the page and embedded in it, so the HTML is one self-contained file.
The Markdown form is docs/benchmarks.md: generated from the committed result files, each number under
its machine.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass
from pathlib import Path

from speechrt.bench.record import FAMILIES, Record, Results, load
from speechrt.cli_paths import output_dir, output_file

TITLES = {
    "asr": "Speech recognition",
    "lm": "Language model",
    "tts": "Speech synthesis",
    "server": "Streaming server",
    "kernels": "Kernels and roofline",
    "gpu": "GPU validation",
}


def add_arguments(p):
    p.add_argument("files", nargs="+", help="result files (speechrt bench ... --json)")
    p.add_argument(
        "--out",
        default=None,
        type=output_file("--out", "report.html", make_parents=True),
        help="HTML page to write (its directory is made if missing); the PNGs go beside it",
    )
    p.add_argument(
        "--markdown",
        default=None,
        type=output_file("--markdown", "benchmarks.md", make_parents=True),
        help="Markdown file to write, e.g. docs/benchmarks.md (its directory is made if missing)",
    )
    p.add_argument(
        "--images",
        default=None,
        type=output_dir("--images"),
        help="folder for the PNGs (default: beside --out, else beside "
        "the Markdown file in a folder of its name: docs/benchmarks/)",
    )
    p.add_argument(
        "--baseline",
        default="0",
        help="the run ratios are taken against: its position among the "
        "files (0: the first) or a part of its name (default 0)",
    )
    p.add_argument("--title", default="speechrt benchmarks")


@dataclass(frozen=True)
class Run:
    name: str  # machine label @ commit
    results: Results


def runs_of(files) -> list[Run]:
    out: list[Run] = []
    for f in files:
        res = load(f)
        m, sw = res.machine, res.machine.get("software", {})
        name = f"{m.get('label', '?')} @ {(sw.get('git_commit') or '?')[:7]}"
        taken = [r.name for r in out]
        if name in taken:
            name += f" #{taken.count(name) + sum(t.startswith(name + ' #') for t in taken) + 1}"
        out.append(Run(name, res))
    return out


def pick_baseline(runs: list[Run], spec: str) -> int:
    from speechrt.errors import UserError

    if spec.isdigit():
        if int(spec) >= len(runs):
            raise UserError(f"--baseline {spec}: there are {len(runs)} runs (0..{len(runs) - 1})")
        return int(spec)
    hits = [i for i, r in enumerate(runs) if spec.lower() in r.name.lower()]
    if len(hits) != 1:
        raise UserError(f"--baseline {spec!r} matches {len(hits)} runs; runs: " + "; ".join(r.name for r in runs))
    return hits[0]


def _scale(v: float, unit: str) -> tuple[float, str, str]:
    """(factor, number format, unit suffix) to print values of about `v`."""
    if unit == "s":
        return (1000, ".0f", " ms") if abs(v) < 1 else (1, ".2f", " s")
    if unit == "us":
        return 1, ".1f", " µs"
    if unit == "%":
        return 1, ".1f", "%"
    if unit == "x":
        return 1, ".3f" if abs(v) < 10 else ".1f", ""
    if unit == "streams":
        return 1, ".0f", ""
    return 1, ".3g" if abs(v) < 1000 else ".0f", f" {unit}" if unit else ""


def fmt(v: float, unit: str, like: float | None = None) -> str:
    """`v` in `unit`, scaled as a value of about `like` would be (default: v)."""
    k, f, suffix = _scale(v if like is None else like, unit)
    return f"{v * k:{f}}{suffix}"


def speedup(r: Record, ref: Record) -> float | None:
    """How many times better `r` is than `ref` (same metric): >1 faster / higher throughput."""
    if r.better == "" or ref.value == 0 or r.value == 0:
        return None
    return ref.value / r.value if r.better == "lower" else r.value / ref.value


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]
    tone: list[list[int]]  # per cell: +1 better, -1 worse, 0 neutral (HTML colours)


def table(runs: list[Run], family: str, base: int) -> Table | None:
    """The family's measurements across the runs that have any; None if none has."""
    keys: dict[tuple, Record] = {}
    by: dict[int, dict[tuple, Record]] = {}
    for i, run in enumerate(runs):
        mine = {r.key: r for r in run.results.records if r.family == family}
        if mine:
            by[i] = mine
            for k, r in mine.items():
                keys.setdefault(k, r)
    if not keys:
        return None
    with_peer = {i for i, m in by.items() if any(r.peer for r in m.values())}
    header = ["engine", "device", "workload", "metric"]
    for i in by:
        header += (
            [runs[i].name]
            + (["vs peer"] if i in with_peer else [])
            + (["vs baseline"] if i != base and base in by else [])
        )
    rows, tone = [], []
    for key, first in keys.items():
        row = [first.label, first.device, first.workload, first.metric + (f" ({first.unit})" if first.unit else "")]
        t = [0, 0, 0, 0]
        for i, mine in by.items():
            r = mine.get(key)
            cells = [(value_text(r), 0) if r is not None else ("–", 0)]
            if i in with_peer:
                p = runs[i].results.peer_of(r) if r is not None else None
                s = speedup(r, p) if p is not None else None
                cells.append((f"{s:.2f}x vs {p.label}" if s is not None else "", _tone(s)))
            if i != base and base in by:
                b = by[base].get(key)
                s = speedup(r, b) if r is not None and b is not None else None
                cells.append((f"{s:.2f}x" if s is not None else "", _tone(s)))
            row += [c for c, _ in cells]
            t += [k for _, k in cells]
        rows.append(row)
        tone.append(t)
    return Table(header, rows, tone)


def value_text(r: Record) -> str:
    """The value, and the range of its repeats in the same scale: '412 ms (398–470 ms, n=5)'."""
    if not r.repeats or r.repeats.n < 2:
        return fmt(r.value, r.unit)
    suffix = _scale(r.value, r.unit)[2]
    lo, hi = (fmt(x, r.unit, like=r.value).removesuffix(suffix) for x in (r.repeats.min, r.repeats.max))
    return f"{fmt(r.value, r.unit)} ({lo}–{hi}{suffix}, n={r.repeats.n})"


def _tone(s: float | None) -> int:
    if s is None:
        return 0
    return 1 if s > 1.05 else -1 if s < 0.95 else 0


def machines(runs: list[Run]) -> list[tuple[str, str, str, str]]:
    """(run name, machine description, command, date) per run."""
    from speechrt.bench.fingerprint import describe

    return [(r.name, describe(r.results.machine), r.results.command, r.results.created[:10]) for r in runs]


def charts(runs: list[Run], images: Path, stem: str) -> dict[str, Path]:
    """family -> PNG written into `images`."""
    from speechrt.bench import plots

    images.mkdir(parents=True, exist_ok=True)
    pairs = [(r.name, r.results) for r in runs]
    out = {}
    for family, draw in plots.CHARTS.items():
        fig = draw(pairs)
        if fig is not None:
            path = images / f"{stem}-{family}.png"
            plots.save(fig, path)
            out[family] = path
    return out


def families(runs: list[Run]) -> list[str]:
    have = {r.family for run in runs for r in run.results.records}
    return [f for f in FAMILIES if f in have]


# ---- HTML -------------------------------------------------------------------------------------------

CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d232b;max-width:1500px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px;margin:8px 0}th,td{border:1px solid #ddd;padding:3px 6px;text-align:left}
th{background:#f3f5f7}td.up{background:#e3f5e1}td.down{background:#fbe3e1}img{max-width:100%;border:1px solid #eee}
.small{color:#555;font-size:12px}"""


# marks the page once loaded with how many of its charts the browser decoded: <body data-plots="4/4">
LOADED_JS = (
    "window.addEventListener('load', () => { const i = [...document.images]; document.body.dataset.plots = "
    "i.filter(x => x.complete && x.naturalWidth > 0).length + '/' + i.length; });"
)


def _html_table(t: Table) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in t.header)
    body = []
    for row, tone in zip(t.rows, t.tone):
        cls = {1: ' class="up"', -1: ' class="down"', 0: ""}
        body.append("<tr>" + "".join(f"<td{cls[k]}>{e(c)}</td>" for c, k in zip(row, tone)) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _png_data(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def html_page(runs: list[Run], base: int, pngs: dict[str, Path], title: str) -> str:
    e = html.escape
    out = io.StringIO()
    out.write(
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{e(title)}</title>"
        f"<style>{CSS}</style></head><body><h1>{e(title)}</h1>\n"
    )
    out.write(
        "<h2>Machines</h2><table><thead><tr><th>run</th><th>machine</th><th>command</th><th>date</th></tr>"
        "</thead><tbody>"
    )
    for m in machines(runs):
        out.write("<tr>" + "".join(f"<td>{e(x)}</td>" for x in m) + "</tr>")
    out.write(
        f"</tbody></table><p class=small>Ratios read “times better”: above 1 is faster (or higher throughput) "
        f"than the peer measured in the same run, or than the baseline run, <b>{e(runs[base].name)}</b>.</p>\n"
    )
    notes = [n for r in runs for n in r.results.notes]
    if notes:
        out.write("<ul class=small>" + "".join(f"<li>{e(n)}</li>" for n in dict.fromkeys(notes)) + "</ul>")
    for fam in families(runs):
        out.write(f'<h2 id="{fam}">{e(TITLES[fam])}</h2>\n')
        if fam in pngs:
            out.write(f'<p><img id="plot-{fam}" alt="{e(TITLES[fam])} chart" src="{_png_data(pngs[fam])}"></p>\n')
        t = table(runs, fam, base)
        if t is not None:
            out.write(_html_table(t) + "\n")
    checks = [(r.name, c) for r in runs for c in r.results.checks]
    if checks:
        out.write(
            "<h2 id=checks>Checks</h2><table><thead><tr><th>run</th><th>check</th><th>status</th><th>detail</th>"
            "</tr></thead><tbody>"
            + "".join(
                f"<tr><td>{e(n)}</td><td>{e(c.name)}</td><td>{e(c.status)}</td><td>{e(c.detail)}</td></tr>"
                for n, c in checks
            )
            + "</tbody></table>"
        )
    skipped = [(r.name, s) for r in runs for s in r.results.skipped]
    if skipped:
        out.write(
            "<h2 id=skipped>Not measured</h2><ul>"
            + "".join(f"<li>{e(n)}: {e(s.family)} {e(s.what)} — {e(s.reason)}</li>" for n, s in skipped)
            + "</ul>"
        )
    out.write(f"<script>{LOADED_JS}</script></body></html>\n")
    return out.getvalue()


# ---- Markdown ---------------------------------------------------------------------------------------


def _md_table(t: Table) -> str:
    def cell(c: str) -> str:
        return c.replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in t.header) + " |", "|" + " --- |" * len(t.header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines)


def markdown(runs: list[Run], base: int, pngs: dict[str, Path], md_path: Path, command: str, title: str) -> str:
    import os

    out = [
        f"# {title}",
        "",
        f"<!-- generated by `{command}` from the result files; edit or re-measure those, not this page -->",
        "",
        "Every number below was measured by `speechrt bench` and read from the result files listed here; "
        "each column is one run, named by its machine and commit. Ratios read “times better”: above 1 is "
        "faster (or higher throughput) than the peer measured in the same run on the same machine.",
        "",
        "| run | machine | command | date |",
        "| --- | --- | --- | --- |",
    ]
    out += [f"| {n} | {d} | `{c}` | {t} |" for n, d, c, t in machines(runs)]
    out.append("")
    files = [r.results.source for r in runs]
    out.append("Result files: " + ", ".join(f"`{f}`" for f in files) + ".")
    notes = [n for r in runs for n in r.results.notes]
    if notes:
        out += ["", "Notes recorded with the runs:", ""] + [f"- {n}" for n in dict.fromkeys(notes)]
    for fam in families(runs):
        out += ["", f"## {TITLES[fam]}", ""]
        if fam in pngs:
            rel = os.path.relpath(pngs[fam], md_path.parent)
            out += [f"![{TITLES[fam]}]({rel})", ""]
        t = table(runs, fam, base)
        if t is not None:
            out.append(_md_table(t))
    skipped = [(r.name, s) for r in runs for s in r.results.skipped]
    if skipped:
        out += ["", "## Not measured", ""] + [f"- {n}: {s.family} {s.what} — {s.reason}" for n, s in skipped]
    return "\n".join(out) + "\n"


def run(args):
    from speechrt.errors import UserError

    if not args.out and not args.markdown:
        raise UserError("say where to write: --out report.html and/or --markdown FILE.md")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("the report's plots need matplotlib: pip install 'speechrt[bench]' (or matplotlib)") from None
    runs = runs_of(args.files)
    base = pick_baseline(runs, args.baseline)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        images = Path(args.images) if args.images else out.parent
        pngs = charts(runs, images, out.stem)
        out.write_text(html_page(runs, base, pngs, args.title))
        print(f"{out}: {len(runs)} run(s), {len(pngs)} chart(s) in {images}")
    if args.markdown:
        md = Path(args.markdown)
        md.parent.mkdir(parents=True, exist_ok=True)
        images = Path(args.images) if args.images else md.parent / md.stem
        pngs = charts(runs, images, md.stem)
        command = " ".join(
            ["speechrt bench report", *args.files, "--markdown", args.markdown]
            + (["--baseline", args.baseline] if args.baseline != "0" else [])
        )
        md.write_text(markdown(runs, base, pngs, md, command, args.title))
        print(f"{md}: {len(runs)} run(s), {len(pngs)} chart(s) in {images}")
    return 0
