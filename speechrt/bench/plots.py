"""The report's charts (matplotlib, drawn off-screen): each function takes the runs as [(name, Results)]
and returns a Figure, or None when no run has the records it plots.

- server_latency: final-transcript latency p50/p95 and first-audio / voice-to-voice against concurrent streams;
- lm_decode: decode tok/s against batch size;
- rtf: real-time factor per backend and precision (speech recognition, speech synthesis);
- roofline: kernels' attained FLOP/s against arithmetic intensity under each device's roofs (datasheet
  peak where the device is known, measured copy/GEMM probe), and each kernel's fraction of its roof.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # off-screen: no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402,F401

from speechrt.bench import roofline  # noqa: E402

MARKERS = "osD^vP*X"


def _series(runs, family, metric, x_param, mode=None):
    """{(run name, label): sorted [(x, value)]} for records of `metric` with numeric params[x_param]."""
    out: dict[tuple[str, str], list] = {}
    for name, res in runs:
        for r in res.records:
            if r.family != family or r.metric != metric or x_param not in r.params:
                continue
            if mode is not None and r.params.get("mode") != mode:
                continue
            out.setdefault((name, r.label), []).append((r.params[x_param], r.value))
    return {k: sorted(v) for k, v in out.items()}


def _legend_name(run: str, label: str, n_runs: int) -> str:
    return label if n_runs == 1 else f"{label} ({run})"


def server_latency(runs):
    """One panel per latency; p50 solid, p95 dashed, one colour and marker per run and configuration across the
    panels, named once in a legend under them (the figure grows with it: a report of many runs stays legible)."""
    panels = [
        ("transcription", ("final_p50_s", "final_p95_s"), "final transcript (transcription)"),
        ("conversation", ("first_audio_p50_s", "first_audio_p95_s"), "first audio (response -> audio)"),
        ("conversation", ("v2v_p50_s", "v2v_p95_s"), "voice-to-voice (end of speech -> audio)"),
    ]
    data = [
        (mode, title, [_series(runs, "server", m, "streams", mode) for m in metrics]) for mode, metrics, title in panels
    ]
    data = [d for d in data if any(d[2])]
    if not data:
        return None
    keys = sorted({k for _, _, series in data for s in series for k in s})
    style = {k: (plt.get_cmap("tab20")(i % 20), MARKERS[i % len(MARKERS)]) for i, k in enumerate(keys)}
    rows = -(-len(keys) // 2)  # legend rows, two columns
    fig, axes = plt.subplots(1, len(data), figsize=(5.2 * len(data), 4 + 0.17 * rows), squeeze=False)
    for ax, (_mode, title, (p50, p95)) in zip(axes[0], data):
        for key in sorted(set(p50) | set(p95)):
            color, marker = style[key]
            for series, line in ((p50, "-"), (p95, "--")):
                if key in series:
                    xs, ys = zip(*series[key])
                    ax.plot(
                        xs,
                        [1000 * y for y in ys],
                        line,
                        marker=marker,
                        color=color,
                        markersize=4,
                        label=_legend_name(*key, len(runs)) if line == "-" or key not in p50 else None,
                    )
        ax.axhline(1000, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_ylim(bottom=0)
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel("latency (ms; p50 solid, p95 dashed)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    named = {}
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            named.setdefault(label, h)
    fig.tight_layout(rect=(0, 0.17 * rows / (4 + 0.17 * rows), 1, 1))
    fig.legend(list(named.values()), list(named), loc="lower center", ncol=2, fontsize=7, frameon=False)
    return fig


def lm_decode(runs):
    series = _series(runs, "lm", "decode_tok_s", "batch")
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (key, pts) in enumerate(sorted(series.items())):
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker=MARKERS[i % len(MARKERS)], label=_legend_name(*key, len(runs)))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("batch size (sequences decoded together)")
    ax.set_ylabel("decode tokens/s (all sequences)")
    ax.set_title("language model decode throughput", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def rtf(runs, family):
    """Bars: one group per workload, one bar per (run, engine/backend/precision)."""
    bars: dict[str, dict[str, float]] = {}  # bar name -> workload -> rtf
    for name, res in runs:
        for r in res.records:
            if r.family == family and r.metric == "rtf":
                bars.setdefault(_legend_name(name, r.label, len(runs)), {})[r.workload] = r.value
    if not bars:
        return None
    workloads = sorted({w for v in bars.values() for w in v})
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * len(workloads) + 3) + 3.5, 4))
    width = 0.8 / len(bars)
    for i, (bar, vals) in enumerate(sorted(bars.items())):
        xs = [j + i * width for j, w in enumerate(workloads) if w in vals]
        ax.bar(xs, [vals[w] for w in workloads if w in vals], width, label=bar, color=f"C{i % 10}")
    ax.set_xticks([j + width * (len(bars) - 1) / 2 for j in range(len(workloads))], workloads, fontsize=8)
    ax.set_ylabel("real-time factor (lower is faster)")
    ax.set_title(
        f"{ {'asr': 'speech recognition', 'tts': 'speech synthesis'}[family] }: compute time / audio time", fontsize=10
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def _roofs(res) -> list[roofline.Peak]:
    """The run's roofs: measured by its probe, and the datasheet's for a known GPU."""
    probe = {r.metric: r for r in res.records if r.family == "kernels" and r.engine == "probe"}
    out = []
    if "copy_GBps" in probe and "matmul_TFLOPs" in probe:
        gpu = probe["copy_GBps"].params.get("gpu", "")
        out.append(roofline.Peak(gpu or "measured", probe["copy_GBps"].value, probe["matmul_TFLOPs"].value, "measured"))
        sheet = roofline.datasheet(gpu) if gpu != "CPU" else roofline.cpu_estimate(res.machine.get("cpu", {}))
        if sheet:
            out.append(sheet)
    return out


def roofline_chart(runs):
    kern = [
        (name, res, [r for r in res.records if r.family == "kernels" and r.metric == "time_us"]) for name, res in runs
    ]
    kern = [k for k in kern if k[2]]
    if not kern:
        return None
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [1, 1.1]})
    labels: list[str] = []
    fracs: dict[str, list[float]] = {}
    for i, (name, res, rows) in enumerate(kern):
        color = f"C{i % 10}"
        for roof in _roofs(res):
            xs = [2 ** (k / 4) for k in range(-16, 57)]  # arithmetic intensity 1/16 .. ~16k FLOP/byte
            # a roof without a bandwidth (a CPU's estimate) is its compute ceiling alone
            ys = [
                min(roof.matmul_tflops, x * roof.bandwidth_gbps / 1000) if roof.bandwidth_gbps else roof.matmul_tflops
                for x in xs
            ]
            bw = f"{roof.bandwidth_gbps:.0f} GB/s, " if roof.bandwidth_gbps else ""
            ax.plot(
                xs,
                ys,
                color=color,
                ls="-" if roof.source == "measured" else "--",
                lw=1,
                label=f"{name}: {roof.source} roof ({bw}{roof.matmul_tflops:.3g} TFLOP/s)",
            )
        for r in rows:
            b, f, t = r.params.get("bytes", 0), r.params.get("flops", 0), r.value * 1e-6
            if f and b:
                ax.scatter([f / b], [f / t / 1e12], color=color, marker="o" if r.backend == "triton" else "x", s=18)
        by = fracs.setdefault(name, {})
        for r in res.records:
            if r.family == "kernels" and r.metric == "roof_fraction":
                lab = f"{r.workload} [{r.backend}]"
                by[lab] = r.value
                if lab not in labels:
                    labels.append(lab)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("attained TFLOP/s")
    ax.set_title("roofline (o: triton, x: torch reference; dashed: datasheet or estimated peak)", fontsize=10)
    ax.legend(fontsize=6, loc="lower right")
    ax.grid(alpha=0.3, which="both")
    height = 0.8 / max(1, len(fracs))
    for i, (name, by) in enumerate(fracs.items()):
        ys = [j + i * height for j, lab in enumerate(labels) if lab in by]
        bx.barh(ys, [100 * by[lab] for lab in labels if lab in by], height, color=f"C{i % 10}", label=name)
    bx.set_yticks(range(len(labels)), labels, fontsize=6)
    bx.invert_yaxis()
    bx.axvline(100, color="grey", lw=0.8, ls=":")
    bx.set_xlabel("% of the measured roof at the kernel's intensity (over 100: its data fit in cache)")
    bx.set_title("fraction of peak (bandwidth or FLOP/s)", fontsize=10)
    if len(fracs) > 1:
        bx.legend(fontsize=7)
    bx.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


# family -> its chart
CHARTS = {
    "asr": lambda runs: rtf(runs, "asr"),
    "lm": lm_decode,
    "tts": lambda runs: rtf(runs, "tts"),
    "server": server_latency,
    "kernels": roofline_chart,
}


def save(fig, path) -> None:
    fig.savefig(path, dpi=110)
    plt.close(fig)
