"""The arguments of ``ringlab analyze`` and what it does with them (``ringlab/cli.py`` wires it).

    ringlab analyze --model gpt3-175b --dp 8 --tp 8 --pp 12 --microbatches 32 --recompute full
    ringlab analyze --layers 24 --hidden 2048 --heads 16 --seq-len 2048 --vocab 50257 --dp 8
    ringlab analyze --model llama2-7b --compare "dp=8,zero=1" "dp=4,tp=2,sp=1"
"""

from __future__ import annotations

import dataclasses
import sys

from .config import Hardware, Layout, Model

LAYOUT_KEYS = {"dp": int, "tp": int, "pp": int, "interleave": int, "micro_batch": int,
               "microbatches": int, "global_batch": int, "zero": int, "sp": lambda v: v in
               ("1", "on", "true", "yes"), "recompute": str, "schedule": str}


def add_arguments(a):
    from .presets import HARDWARE, MODELS
    g = a.add_argument_group("model (a preset, or the shape)")
    g.add_argument("--model", choices=sorted(MODELS), help="a published model's shape")
    for name in ("layers", "hidden", "heads", "seq-len", "vocab", "ffn", "kv-heads"):
        g.add_argument(f"--{name}", type=int)
    g.add_argument("--gated", action="store_true", help="SwiGLU MLP (three matrices)")
    l_ = a.add_argument_group("layout")
    for name in ("dp", "tp", "pp", "interleave", "micro-batch"):
        l_.add_argument(f"--{name}", type=int, default=1)
    l_.add_argument("--microbatches", type=int, help="per pipeline (gradient accumulation)")
    l_.add_argument("--global-batch", type=int, help="sequences per iteration")
    l_.add_argument("--sp", action="store_true", help="sequence parallelism")
    l_.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3])
    l_.add_argument("--recompute", default="none", choices=["none", "selective", "full"])
    l_.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    l_.add_argument("--no-overlap-dp", action="store_true",
                    help="the gradient sync waits for the end of backward")
    l_.add_argument("--pp-scatter-gather", action="store_true")
    h = a.add_argument_group("hardware (a preset, then any of these to change it)")
    h.add_argument("--hardware", choices=sorted(HARDWARE), default="dgx-a100")
    h.add_argument("--gpus-per-node", type=int)
    h.add_argument("--intra-bw", type=float, help="GB/s per GPU inside a node")
    h.add_argument("--inter-bw", type=float, help="GB/s per GPU between nodes")
    h.add_argument("--intra-latency", type=float, help="microseconds")
    h.add_argument("--inter-latency", type=float, help="microseconds")
    h.add_argument("--peak-tflops", type=float)
    h.add_argument("--achieved", type=float, help="fraction of peak the matmuls reach")
    h.add_argument("--memory-gb", type=float)
    a.add_argument("--compare", nargs="+", metavar="K=V,...",
                   help='several layouts side by side, each like "dp=8,tp=2,sp=1"')
    a.add_argument("--json", action="store_true", help="print the report as JSON")


def build_model(args):
    from .presets import MODELS
    shape = {"layers": args.layers, "hidden": args.hidden, "heads": args.heads,
             "seq_len": args.seq_len, "vocab": args.vocab, "ffn": args.ffn,
             "kv_heads": args.kv_heads}
    given = {k: v for k, v in shape.items() if v is not None}
    if args.model:
        return dataclasses.replace(MODELS[args.model], **given,
                                   **({"gated": True} if args.gated else {}))
    missing = [k for k in ("layers", "hidden", "heads", "seq_len", "vocab") if k not in given]
    if missing:
        raise ValueError("give --model NAME or the shape: missing "
                         + ", ".join("--" + k.replace("_", "-") for k in missing))
    return Model("custom", gated=args.gated, **given)


def build_hardware(args):
    from .presets import HARDWARE
    change = {"gpus_per_node": args.gpus_per_node, "peak_flops": args.peak_tflops and
              args.peak_tflops * 1e12, "intra_bw": args.intra_bw and args.intra_bw * 1e9,
              "inter_bw": args.inter_bw and args.inter_bw * 1e9, "achieved": args.achieved,
              "intra_latency": args.intra_latency and args.intra_latency * 1e-6,
              "inter_latency": args.inter_latency and args.inter_latency * 1e-6,
              "memory": args.memory_gb and args.memory_gb * 1e9}
    return dataclasses.replace(HARDWARE[args.hardware],
                               **{k: v for k, v in change.items() if v is not None})


def build_layout(args, override=""):
    kw = dict(dp=args.dp, tp=args.tp, pp=args.pp, interleave=args.interleave,
              micro_batch=args.micro_batch, microbatches=args.microbatches,
              global_batch=args.global_batch, sp=args.sp, zero=args.zero,
              recompute=args.recompute, schedule=args.schedule,
              overlap_dp=not args.no_overlap_dp, pp_scatter_gather=args.pp_scatter_gather)
    for item in filter(None, override.split(",")):
        key, _, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if key not in LAYOUT_KEYS:
            raise ValueError(f"--compare: unknown layout key {key!r}; known: "
                             + ", ".join(LAYOUT_KEYS))
        kw[key] = LAYOUT_KEYS[key](value.strip())
    if override and "global_batch" not in override and "microbatches" not in override:
        kw["microbatches"] = kw["microbatches"] if args.global_batch is None else None
    return Layout(**kw)


def run_analyze(args):
    from .compare import compare_layouts
    from .step import analyze
    try:
        model, hardware = build_model(args), build_hardware(args)
        if args.compare:
            text, reports = compare_layouts(model, hardware,
                                            [build_layout(args, o) for o in args.compare],
                                            reports=True)
            if args.json:
                import json
                print(json.dumps([r.to_dict() for r in reports], indent=1))
            else:
                print(text)
            return 0
        report = analyze(model, build_layout(args), hardware)
    except ValueError as e:
        print(f"ringlab analyze: {e}", file=sys.stderr)
        return 2
    print(report.to_json() if args.json else report.table())
    return 0
