"""The arguments of ``ringlab analyze`` and what it does with them (``ringlab/cli.py`` wires it).

    ringlab analyze --model gpt3-175b --dp 8 --tp 8 --pp 12 --microbatches 32 --recompute full
    ringlab analyze --layers 24 --hidden 2048 --heads 16 --seq-len 2048 --vocab 50257 --dp 8
    ringlab analyze --model llama2-7b --compare "dp=8,zero=1" "dp=4,tp=2,sp=1"
    ringlab analyze --model llama3-405b --hardware dgx-h100 --tp 8 --cp 16 --pp 16 --dp 8 ...

Every setting of a model is an option, on a preset too (``--model llama2-7b
--no-gated``): a preset changed this way is named with a "*". A combination
that cannot run exits with status 2 and the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from .config import ATTENTION, CP_KINDS, OVERLAP_TP, Layout, Model


def _bool(value):
    return value.strip().lower() in ("1", "on", "true", "yes")


LAYOUT_KEYS = {"dp": int, "tp": int, "pp": int, "cp": int, "ep": int, "interleave": int,
               "micro_batch": int, "microbatches": int, "global_batch": int, "zero": int,
               "sp": _bool, "fp8": _bool, "recompute": str, "schedule": str, "attention": str,
               "cp_kind": str, "overlap_tp": str, "overlap_dp": _bool, "overlap_pp": _bool,
               "overlap_param_gather": _bool, "capacity": float}

MODEL_SWITCHES = {"gated": "SwiGLU MLP (three matrices)",
                  "bias": "biases and LayerNorm (else RMSNorm, no biases)",
                  "learned-positions": "a learned position embedding (s x h)",
                  "tied-embeddings": "the output head shares the embedding",
                  "dropout": "dropout after the softmax and on both residual branches",
                  "rotary": "rotary position embeddings on Q and K"}


def add_arguments(a):
    from .presets import HARDWARE, MODELS
    g = a.add_argument_group("model (a preset, or the shape; any option changes a preset)")
    g.add_argument("--model", choices=sorted(MODELS), help="a published model's shape")
    for name in ("layers", "hidden", "heads", "seq-len", "vocab", "ffn", "kv-heads"):
        g.add_argument(f"--{name}", type=int,
                       help={"kv-heads": "key/value heads (fewer than heads: GQA)",
                             "ffn": "the MLP's hidden size (default 4 x hidden)"}.get(name))
    for name, help_ in MODEL_SWITCHES.items():
        g.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=None,
                       help=help_)
    g.add_argument("--experts", type=int, help="experts per MoE layer (0: dense)")
    g.add_argument("--top-k", type=int, help="experts each token goes to")
    g.add_argument("--moe-ffn", type=int, help="an expert's hidden size (default ffn)")
    g.add_argument("--shared-experts", type=int, help="experts every token goes to")
    g.add_argument("--moe-layers", type=int,
                   help="layers with experts, the last ones (default all)")
    g.add_argument("--fp32-grads", action=argparse.BooleanOptionalAction, default=None,
                   help="accumulate and reduce gradients in fp32 (Megatron-LM's default)")
    l_ = a.add_argument_group("layout")
    for name in ("dp", "tp", "pp", "cp", "ep", "interleave", "micro-batch"):
        l_.add_argument(f"--{name}", type=int, default=1, help={
            "cp": "context parallelism: each sequence over this many ranks",
            "ep": "expert parallelism: experts over this many ranks of a stage",
            "interleave": "model chunks per pipeline rank"}.get(name))
    l_.add_argument("--microbatches", type=int, help="per pipeline (gradient accumulation)")
    l_.add_argument("--global-batch", type=int, help="sequences per iteration")
    l_.add_argument("--stage-layers", metavar="N,N,...",
                    help="layers of each model chunk (pp x interleave numbers; default: "
                         "as even as possible, extra layers in the middle)")
    l_.add_argument("--sp", action="store_true", help="sequence parallelism")
    l_.add_argument("--cp-kind", default="ring", choices=CP_KINDS,
                    help="ring attention, or an AllGather of K and V (Llama 3)")
    l_.add_argument("--capacity", type=float, help="MoE capacity factor (default: none)")
    l_.add_argument("--zero", type=int, choices=[0, 1, 2, 3])
    l_.add_argument("--distributed-optimizer", action="store_true",
                    help="Megatron-LM's distributed optimizer: ZeRO-1 over dp x cp")
    l_.add_argument("--recompute", default="none", choices=["none", "selective", "full"])
    l_.add_argument("--attention", default="flash", choices=ATTENTION,
                    help="FlashAttention, or unfused matmuls and softmax (Megatron 2021)")
    l_.add_argument("--fp8", action="store_true", help="the linear layers' matmuls in FP8")
    l_.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    l_.add_argument("--overlap-tp", default="backward", choices=OVERLAP_TP,
                    help="TP collectives under matmuls: none, the backward's (Megatron's "
                         "async), or all (chunked; needs --sp)")
    l_.add_argument("--no-overlap-dp", action="store_true",
                    help="the gradient sync waits for the end of backward")
    l_.add_argument("--overlap-param-gather", action="store_true",
                    help="ZeRO-1/2's parameter AllGather under the next forward")
    l_.add_argument("--no-overlap-pp", action="store_true",
                    help="interleaved schedules do not send under compute")
    l_.add_argument("--pp-scatter-gather", action="store_true")
    h = a.add_argument_group("hardware (a preset, then any of these to change it)")
    h.add_argument("--hardware", choices=sorted(HARDWARE), default="dgx-a100")
    h.add_argument("--gpus-per-node", type=int)
    h.add_argument("--intra-bw", type=float, help="GB/s per GPU inside a node")
    h.add_argument("--inter-bw", type=float, help="GB/s per GPU between nodes")
    h.add_argument("--intra-latency", type=float, help="microseconds")
    h.add_argument("--inter-latency", type=float, help="microseconds")
    h.add_argument("--peak-tflops", type=float, help="dense 16-bit")
    h.add_argument("--fp8-tflops", type=float, help="dense FP8 (0: none)")
    h.add_argument("--hbm-tbps", type=float, help="HBM bandwidth, TB/s")
    h.add_argument("--sms", type=int, help="streaming multiprocessors")
    h.add_argument("--efficiency", type=float,
                   help="fraction of peak the best-shaped matmul sustains (the stack's "
                        "GEMMs; preset: measured at the power limit)")
    h.add_argument("--fp8-efficiency", type=float)
    h.add_argument("--attention-efficiency", type=float,
                   help="fraction of peak FlashAttention reaches")
    h.add_argument("--hbm-efficiency", type=float,
                   help="fraction of HBM bandwidth memory-bound kernels reach")
    h.add_argument("--intra-efficiency", type=float,
                   help="fraction of --intra-bw NCCL's collectives reach (preset: measured)")
    h.add_argument("--inter-efficiency", type=float,
                   help="fraction of --inter-bw NCCL's collectives reach (preset: measured)")
    h.add_argument("--memory-gb", type=float)
    a.add_argument("--compare", nargs="+", metavar="K=V,...",
                   help='several layouts side by side, each like "dp=8,tp=2,sp=1"')
    a.add_argument("--json", action="store_true", help="print the report as JSON")


def build_model(args):
    from .presets import MODELS
    shape = {"layers": args.layers, "hidden": args.hidden, "heads": args.heads,
             "seq_len": args.seq_len, "vocab": args.vocab, "ffn": args.ffn,
             "kv_heads": args.kv_heads, "experts": args.experts, "top_k": args.top_k,
             "moe_ffn": args.moe_ffn, "shared_experts": args.shared_experts,
             "moe_layers": args.moe_layers}
    for name in MODEL_SWITCHES:
        shape[name.replace("-", "_")] = getattr(args, name.replace("-", "_"))
    if args.fp32_grads is not None:
        shape["grad_bytes"] = 4 if args.fp32_grads else 2
    given = {k: v for k, v in shape.items() if v is not None}
    if args.model:
        base = MODELS[args.model]
        changed = {k: v for k, v in given.items() if getattr(base, k) != v}
        if changed.get("hidden") and "ffn" not in given and base.ffn == 4 * base.hidden:
            changed["ffn"] = None                     # 4 x the new hidden size, as a GPT
        if changed.get("heads") and "kv_heads" not in given and base.kv_heads == base.heads:
            changed["kv_heads"] = None                # still one kv head per head
        name = base.name + ("*" if changed else "")
        return dataclasses.replace(base, name=name, **changed)
    missing = [k for k in ("layers", "hidden", "heads", "seq_len", "vocab") if k not in given]
    if missing:
        raise ValueError("give --model NAME or the shape: missing "
                         + ", ".join("--" + k.replace("_", "-") for k in missing))
    return Model("custom", **given)


def build_hardware(args):
    from .presets import HARDWARE

    def scaled(value, factor):
        return None if value is None else value * factor

    change = {"gpus_per_node": args.gpus_per_node, "peak_flops": scaled(args.peak_tflops, 1e12),
              "fp8_flops": scaled(args.fp8_tflops, 1e12), "hbm_bw": scaled(args.hbm_tbps, 1e12),
              "sms": args.sms, "intra_bw": scaled(args.intra_bw, 1e9),
              "inter_bw": scaled(args.inter_bw, 1e9), "efficiency": args.efficiency,
              "fp8_efficiency": args.fp8_efficiency,
              "attention_efficiency": args.attention_efficiency,
              "hbm_efficiency": args.hbm_efficiency,
              "intra_efficiency": args.intra_efficiency,
              "inter_efficiency": args.inter_efficiency,
              "intra_latency": scaled(args.intra_latency, 1e-6),
              "inter_latency": scaled(args.inter_latency, 1e-6),
              "memory": scaled(args.memory_gb, 1e9)}
    return dataclasses.replace(HARDWARE[args.hardware],
                               **{k: v for k, v in change.items() if v is not None})


def build_layout(args, override=""):
    if args.distributed_optimizer and args.zero not in (None, 1):
        raise ValueError(f"--distributed-optimizer is ZeRO-1; it cannot go with --zero "
                         f"{args.zero}")
    stage_layers = None
    if args.stage_layers:
        try:
            stage_layers = tuple(int(n) for n in args.stage_layers.split(","))
        except ValueError:
            raise ValueError(f"--stage-layers: give whole numbers separated by commas, got "
                             f"{args.stage_layers!r}") from None
    kw = dict(dp=args.dp, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep,
              interleave=args.interleave, micro_batch=args.micro_batch,
              microbatches=args.microbatches, global_batch=args.global_batch,
              stage_layers=stage_layers, sp=args.sp, cp_kind=args.cp_kind,
              capacity=args.capacity, zero=1 if args.distributed_optimizer else (args.zero or 0),
              recompute=args.recompute, attention=args.attention, fp8=args.fp8,
              schedule=args.schedule, overlap_tp=args.overlap_tp,
              overlap_dp=not args.no_overlap_dp, overlap_pp=not args.no_overlap_pp,
              overlap_param_gather=args.overlap_param_gather,
              pp_scatter_gather=args.pp_scatter_gather)
    for item in filter(None, override.split(",")):
        key, _, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if key not in LAYOUT_KEYS:
            raise ValueError(f"--compare: unknown layout key {key!r}; known: "
                             + ", ".join(LAYOUT_KEYS))
        try:
            kw[key] = LAYOUT_KEYS[key](value.strip())
        except ValueError:
            raise ValueError(f"--compare: {key} = {value.strip()!r} is not a "
                             f"{LAYOUT_KEYS[key].__name__}") from None
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
