"""Several layouts of one model on one cluster, side by side.

    >>> from ringlab.analysis import presets, Layout
    >>> text = compare_layouts(presets.MODELS["megatron-7.5b"], presets.HARDWARE["dgx-a100"],
    ...                        [Layout(dp=32, tp=4, global_batch=512),
    ...                         Layout(dp=16, tp=8, global_batch=512)])
    >>> text.splitlines()[0].split()
    ['layout', 'dp32-tp4-pp1', 'dp16-tp8-pp1']
"""

from __future__ import annotations

from .step import analyze

ROWS = [
    ("GPUs", lambda r: f"{r.layout.gpus}"),
    ("microbatches", lambda r: f"{r.layout.microbatches}"),
    ("TP GB sent", lambda r: f"{_kind(r, 'tp_') / 1e9:.2f}"),
    ("PP GB sent", lambda r: f"{_kind(r, 'pp_') / 1e9:.2f}"),
    ("DP GB sent", lambda r: f"{(_kind(r, 'dp_') + _kind(r, 'zero3_')) / 1e9:.2f}"),
    ("compute s", lambda r: f"{r.times['compute']:.3f}"),
    ("TP exposed s", lambda r: f"{r.times['tp']:.3f}"),
    ("bubble", lambda r: f"{r.bubble:.3f}"),
    ("exposed PP+DP s", lambda r: f"{r.times['pp_exposed'] + r.times['dp_exposed']:.3f}"),
    ("step s", lambda r: f"{r.step:.3f}"),
    ("TFLOP/s per GPU", lambda r: f"{r.tflops_per_gpu:.1f}"),
    ("MFU", lambda r: f"{r.mfu:.1%}"),
    ("memory GB", lambda r: f"{r.memory['total'] / 1e9:.1f}"),
    ("fits", lambda r: "yes" if r.fits else "NO"),
]


def _kind(report, prefix):
    return sum(c.bytes_sent for c in report.comms if c.kind.startswith(prefix))


def label(layout):
    out = f"dp{layout.dp}-tp{layout.tp}-pp{layout.pp}"
    out += f"-cp{layout.cp}" if layout.cp > 1 else ""
    out += f"-ep{layout.ep}" if layout.ep > 1 else ""
    out += f"-v{layout.interleave}" if layout.interleave > 1 else ""
    out += f"-b{layout.micro_batch}" if layout.micro_batch > 1 else ""
    out += "-sp" if layout.sp else ""
    out += f"-z{layout.zero}" if layout.zero else ""
    out += {"selective": "-sel", "full": "-full"}.get(layout.recompute, "")
    return out


def compare_layouts(model, hardware, layouts, reports=False):
    """A text table, one column per layout (``reports=True``: also the reports).
    Labels too wide for 88 columns in all go on two header lines, the degrees
    (``dp8-tp8-pp4``) above the options (``sp-z1-sel``)."""
    done = [analyze(model, lay, hardware) for lay in layouts]
    names = [label(lay) for lay in layouts]
    one_line = 17 + sum(max(12, len(n) + 2) for n in names)
    heads = [[n] for n in names]
    if one_line > 88:
        degrees = [sum(part[:2] in ("dp", "tp", "pp", "cp", "ep") for part in n.split("-"))
                   for n in names]
        heads = [["-".join(n.split("-")[:k]), "-".join(n.split("-")[k:])]
                 for n, k in zip(names, degrees)]
    widths = [max(12, *(len(part) + 2 for part in head)) for head in heads]
    lines = [f"{'layout' if i == 0 else '':<17}"
             + "".join(f"{head[i]:>{w}}" for head, w in zip(heads, widths))
             for i in range(len(heads[0]))]
    for title, cell in ROWS:
        lines.append(f"{title:<17}" + "".join(f"{cell(r):>{w}}" for r, w in zip(done, widths)))
    text = "\n".join(lines)
    return (text, done) if reports else text
