#!/usr/bin/env python3
"""Training throughput side by side: `deltagrad train` and the same Gated DeltaNet LM in PyTorch
with flash-linear-attention's GatedDeltaNetForCausalLM, on the same GPU in the same call.

For each configuration (CONFIGS below) it runs
  1. build/release/deltagrad train --device cuda --precision P --steps N --quiet (evaluation and
     checkpointing only after the last step), and reads the run's metrics.csv: the step times from
     its elapsed_s column, the peak GPU memory from its peak_mb or gpu_peak_mib column (the peak
     of the run's tensor bytes on the device); the parameter names and shapes from the header of
     the model.safetensors it writes (deltagrad names its parameters as FLA does), and config.json;
  2. the same model in PyTorch (a separate Python process per configuration, so the peak memory is
     that run's): fla.models.GatedDeltaNetForCausalLM built from a GatedDeltaNetConfig mirroring
     ours, f32 parameters, torch.autocast(bf16) when P is bf16 (plain f32 otherwise),
     torch.optim.AdamW(fused=True) with deltagrad's learning rate schedule, betas, eps, weight
     decay (and its rule for which parameters decay) and gradient clipping; the loss is FLA's own:
     model(input_ids=x, labels=x) with FLA's default fused cross-entropy (--fla-unfused: the plain
     modules and nn.CrossEntropyLoss); eager, no torch.compile; step times from CUDA events, peak
     memory from torch.cuda.max_memory_allocated.
Both sides draw their tokens from the same data: the text file (task text) or random tokens
(mqar: deltagrad makes MQAR sequences, FLA takes random tokens of the same shape and computes the
loss on every position; the time of a step does not depend on the token values).
The first --warmup-steps steps are left out of the rate: ms/step is the mean over the rest.
Before timing, the parameter names and shapes of the two models are compared: a configuration
whose models differ fails.

Prints one table (config, side, precision, tokens/s, ms/step, peak GPU MiB, deltagrad/FLA) and
writes it as OUTDIR/train_side_by_side.{md,csv,json}; the runs' logs are in OUTDIR/logs/.
Exit status: 0 when every run succeeded, 1 when one failed (the table says which), 2 when it could
not start (no binary, no torch or FLA).

  python3 bench/train_side_by_side.py [--out DIR] [--configs a,b,c] [--steps 30] [--precision bf16]
  python3 bench/train_side_by_side.py --device-cpu-smoke     (deltagrad on the CPU, a tiny model)
bench/train_side_by_side.sh runs it with TRITON_CACHE_DIR set (docs/PERF.md, "Training side by side").
"""
import argparse
import contextlib
import csv
import json
import math
import os
import random
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time

# The model, in FLA's config names; deltagrad_args() and fla_config() turn it into each side's
# settings.  The defaults are deltagrad's (models/model_config.c); a configuration sets what it changes.
MODEL_DEFAULTS = {"hidden_size": 128, "num_hidden_layers": 2, "num_heads": 1, "head_dim": 128, "expand_v": 1.0,
                  "use_gate": True, "use_short_conv": True, "conv_size": 4, "norm_eps": 1e-6, "hidden_ratio": 4,
                  "intermediate_size": 256, "vocab_size": 256, "tie_word_embeddings": False,
                  "initializer_range": 0.02}
# The optimiser and schedule, deltagrad's defaults (models/train_config.c), given to both sides.
TRAIN = {"lr": 1e-3, "min_lr_ratio": 0.1, "warmup": 100, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
         "adam_eps": 1e-8, "clip": 1.0, "seed": 1}
CONFIGS = {
    # deltagrad train's default model on its default task (MQAR, sequences of 128, batch 64)
    "a": {"name": "mqar-default", "task": "mqar", "batch": 64, "seq_len": 128, "model": {}},
    # 56M parameters; the MLP by FLA's rule: 2/3 * 4 * hidden rounded up to 256
    "b": {"name": "56M", "task": "text", "batch": 8, "seq_len": 2048,
          "model": {"hidden_size": 1024, "num_hidden_layers": 4, "num_heads": 8, "head_dim": 128, "expand_v": 1.0,
                    "intermediate_size": 0}},
    # hidden 2048, 12 layers, 16 heads of 128: 669M parameters (the MLP, 3 * 2048 * 5632 a layer, is
    # over half of them); batch 4 x 4096
    "c": {"name": "669M", "task": "text", "batch": 4, "seq_len": 4096,
          "model": {"hidden_size": 2048, "num_hidden_layers": 12, "num_heads": 16, "head_dim": 128,
                    "expand_v": 1.0, "intermediate_size": 0}},
    # --device-cpu-smoke: a model small enough for the CPU (deltagrad only)
    "smoke": {"name": "cpu-smoke", "task": "text", "batch": 2, "seq_len": 64,
              "model": {"hidden_size": 64, "num_hidden_layers": 1, "num_heads": 1, "head_dim": 32,
                        "intermediate_size": 0}},
}
TEXT_BYTES = 4 << 20


def log(*a):
    print(*a, flush=True)


def die(msg):
    """could not start: exit status 2"""
    print("train_side_by_side: " + msg, file=sys.stderr, flush=True)
    sys.exit(2)


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="results folder (default: a new temporary folder)")
    ap.add_argument("--configs", default="a,b,c", help="which of " + ",".join(CONFIGS) + " (default a,b,c)")
    ap.add_argument("--steps", type=int, default=30, help="training steps per run (default 30)")
    ap.add_argument("--warmup-steps", type=int, default=10,
                    help="first steps left out of the rate (default 10); not the lr warm-up")
    ap.add_argument("--precision", choices=["bf16", "f32"], default="bf16",
                    help="deltagrad --precision; FLA: torch.autocast(bf16) or plain f32 (default bf16)")
    ap.add_argument("--batch", type=int, default=None, help="sequences per step, for every chosen config")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per sequence, for every chosen config")
    ap.add_argument("--skip-fla", action="store_true", help="deltagrad only (no torch needed)")
    ap.add_argument("--also-no-graph", action="store_true",
                    help="a second deltagrad row per config with --no-graph (each step launched kernel by kernel)")
    ap.add_argument("--fla-unfused", action="store_true",
                    help="FLA with fuse_norm, fuse_swiglu, fuse_cross_entropy off (default: FLA's defaults, on)")
    ap.add_argument("--fla-path", default=None,
                    help="a folder holding FLA's fla/ package, put first on sys.path (default: the installed fla)")
    ap.add_argument("--deltagrad", default="build/release/deltagrad", help="the deltagrad binary")
    ap.add_argument("--timeout", type=float, default=420,
                    help="seconds one run may take, each side (default 420; FLA's first run autotunes)")
    ap.add_argument("--device-cpu-smoke", action="store_true",
                    help="deltagrad on the CPU with the tiny config 'smoke' (implies --skip-fla): checks this "
                         "script's deltagrad side without a GPU")
    ap.add_argument("--fla-worker", nargs=2, metavar=("SPEC", "RESULT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.device_cpu_smoke:
        a.skip_fla = True
        if a.configs == "a,b,c":
            a.configs = "smoke"
    if a.steps < 2 or not 0 <= a.warmup_steps < a.steps:
        ap.error(f"--steps {a.steps} / --warmup-steps {a.warmup_steps}: need 0 <= warmup-steps < steps, steps >= 2")
    if (a.batch is not None and a.batch < 1) or (a.seq_len is not None and a.seq_len < 1):
        ap.error("--batch and --seq-len must be >= 1")
    a.config_list = [c for c in a.configs.split(",") if c]
    unknown = [c for c in a.config_list if c not in CONFIGS]
    if unknown or not a.config_list:
        ap.error(f"--configs {a.configs}: unknown {unknown}; choose from {','.join(CONFIGS)}")
    return a


# ---- the model on both sides ------------------------------------------------------------------


def model_of(cfg):
    m = dict(MODEL_DEFAULTS)
    m.update(cfg["model"])
    return m


def intermediate_size(m):
    """the MLP width both sides use (FLA's GatedMLP rule when intermediate_size is 0)"""
    if m["intermediate_size"] > 0:
        return m["intermediate_size"]
    return 256 * ((int(m["hidden_size"] * m["hidden_ratio"] * 2 / 3) + 255) // 256)


def fla_config(m, fused):
    """GatedDeltaNetConfig's arguments for model m (FLA's names; num_v_heads None: = num_heads)"""
    return {"attn_mode": "chunk", "hidden_size": m["hidden_size"], "num_hidden_layers": m["num_hidden_layers"],
            "num_heads": m["num_heads"], "head_dim": m["head_dim"], "expand_v": m["expand_v"], "num_v_heads": None,
            "use_gate": m["use_gate"], "use_short_conv": m["use_short_conv"], "conv_size": m["conv_size"],
            "allow_neg_eigval": False, "norm_eps": m["norm_eps"], "hidden_ratio": m["hidden_ratio"],
            "intermediate_size": m["intermediate_size"] or None, "hidden_act": "swish",
            "vocab_size": m["vocab_size"], "tie_word_embeddings": m["tie_word_embeddings"],
            "initializer_range": m["initializer_range"], "fuse_norm": fused, "fuse_swiglu": fused,
            "fuse_cross_entropy": fused, "fuse_linear_cross_entropy": False, "use_cache": False}


def deltagrad_args(cfg, m, args, data, out_dir, precision_flag):
    B = args.batch or cfg["batch"]
    T = args.seq_len or cfg["seq_len"]
    tf = {True: "true", False: "false"}
    a = ["train", "--device", "cpu" if args.device_cpu_smoke else "cuda", "--task", cfg["task"],
         "--hidden-size", m["hidden_size"], "--layers", m["num_hidden_layers"], "--heads", m["num_heads"],
         "--head-dim", m["head_dim"], "--expand-v", m["expand_v"], "--use-gate=" + tf[m["use_gate"]],
         "--short-conv=" + tf[m["use_short_conv"]], "--conv-size", m["conv_size"], "--no-conv-bias",
         "--no-neg-eigval", "--norm-eps", m["norm_eps"], "--hidden-ratio", m["hidden_ratio"],
         "--intermediate-size", m["intermediate_size"], "--vocab-size", m["vocab_size"],
         "--tie-embeddings=" + tf[m["tie_word_embeddings"]], "--init-range", m["initializer_range"],
         "--batch", B, "--seq-len", T, "--steps", args.steps,
         "--lr", TRAIN["lr"], "--min-lr-ratio", TRAIN["min_lr_ratio"], "--warmup", TRAIN["warmup"],
         "--weight-decay", TRAIN["weight_decay"], "--beta1", TRAIN["beta1"], "--beta2", TRAIN["beta2"],
         "--adam-eps", TRAIN["adam_eps"], "--clip", TRAIN["clip"], "--seed", TRAIN["seed"],
         "--eval-every", 0, "--save-every", 0, "--log-every", 50, "--quiet", "--overwrite", "--out", out_dir]
    if cfg["task"] == "text":
        a += ["--data", data, "--eval-batches", 1]
    else:
        a += ["--target-acc", 0, "--eval-examples", 64]
    if precision_flag:  # the CPU refuses bf16
        a += ["--precision", "f32" if args.device_cpu_smoke else args.precision]
    if args.device_cpu_smoke:
        a += ["--threads", 2]
    return [str(x) for x in a], B, T


def decays(name):
    """deltagrad's rule (models/optim.c dg_param_decays): no weight decay on norms, A_log, dt_bias, biases"""
    parts = name.split(".")
    return not (any(p.endswith("norm") for p in parts) or parts[-1] in ("A_log", "dt_bias", "bias"))


def lr_at(step, steps):
    """deltagrad's schedule (models/optim.c dg_lr_at) for the 0-based step: linear warm-up, cosine decay"""
    w, r = TRAIN["warmup"], TRAIN["min_lr_ratio"]
    if step < w:
        return TRAIN["lr"] * (step + 1) / w
    p = min(1.0, (step - w) / (steps - w)) if steps > w else 1.0
    return TRAIN["lr"] * (r + (1 - r) * 0.5 * (1 + math.cos(math.pi * p)))


# ---- child processes ----------------------------------------------------------------------------

_children = set()


def _die_with_parent():
    """in the child: its own process group (a timeout kills the whole of it) and SIGKILL when this
    script dies, however it dies (prctl PR_SET_PDEATHSIG)"""
    os.setpgrp()
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass


def _kill_group(p):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            pass


def run_logged(cmd, log_path, timeout, env=None):
    """runs cmd with its output in log_path; (returncode or None on timeout, seconds, output tail)"""
    t0 = time.time()
    with open(log_path, "w") as lf:
        lf.write("$ " + " ".join(cmd) + "\n")
        lf.flush()
        p = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                             preexec_fn=_die_with_parent)
        _children.add(p)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            _kill_group(p)
            _children.discard(p)
    with open(log_path, errors="replace") as lf:
        lines = [ln.strip() for ln in lf.read().splitlines()[1:] if ln.strip()]
    return rc, time.time() - t0, " / ".join(lines[-3:])[-600:]


def failure(rc, timeout, tail, log_path):
    why = f"timed out after {timeout:g} s" if rc is None else f"exit status {rc}"
    return f"{why}: {tail or '(no output)'} (log {log_path})"


def _on_signal(signum, frame):
    for p in list(_children):
        _kill_group(p)
    sys.exit(128 + signum)


# ---- deltagrad's side --------------------------------------------------------------------------


def safetensors_shapes(path):
    """{name: shape} from a safetensors header"""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        if n > 100 << 20:
            raise ValueError(f"{path}: header of {n} bytes")
        head = json.loads(f.read(n))
    return {k: list(v["shape"]) for k, v in head.items() if k != "__metadata__"}


def read_metrics(path, warm, tokens_per_step):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path} has no rows")
    steps = [int(float(r["step"])) for r in rows]
    el = [float(r["elapsed_s"]) for r in rows]
    if steps != list(range(1, len(rows) + 1)):
        raise ValueError(f"{path}: the steps are not 1..{len(rows)}")
    times = [el[0]] + [el[i] - el[i - 1] for i in range(1, len(el))]  # s a step
    timed = times[warm:]
    ms = 1000 * sum(timed) / len(timed)
    res = {"steps": len(rows), "ms_per_step": ms, "median_ms_per_step": 1000 * statistics.median(timed),
           "tokens_per_s": tokens_per_step / (ms / 1000), "loss_first": float(rows[0]["loss"]),
           "loss_last": float(rows[-1]["loss"]), "peak_mib": None}
    # the peak of the run's tensor bytes on its device: gpu_peak_mib (MiB) or peak_mb (1e6 bytes)
    for col, to_mib in (("gpu_peak_mib", 1.0), ("peak_mb", 1e6 / 2**20)):
        peaks = [float(r[col]) for r in rows if r.get(col) not in (None, "", "nan")]
        if peaks:
            res["peak_mib"] = max(peaks) * to_mib
            break
    return res


def run_deltagrad(key, cfg, args, data, precision_flag, extra=()):
    """one deltagrad run; extra: more options (e.g. --no-graph), which name the row's side too"""
    m = model_of(cfg)
    tag = "".join(extra)
    out_dir = os.path.join(args.out, "runs", f"{key}-deltagrad{tag}")
    cmd_args, B, T = deltagrad_args(cfg, m, args, data, out_dir, precision_flag)
    cmd_args += list(extra)
    log_path = os.path.join(args.out, "logs", f"{key}-deltagrad{tag}.log")
    log(f"[{key}] deltagrad: {args.deltagrad} " + " ".join(cmd_args))
    rc, secs, tail = run_logged([args.deltagrad] + cmd_args, log_path, args.timeout)
    row = {"side": " ".join(["deltagrad", *extra]), "wall_s": round(secs, 1), "log": log_path,
           "precision": args.precision if precision_flag else "f32 (no --precision in this build)"}
    if args.device_cpu_smoke:
        row["precision"] = "f32 (cpu)"
    if rc != 0:
        row["error"] = failure(rc, args.timeout, tail, log_path)
        return row
    try:
        row.update(read_metrics(os.path.join(out_dir, "metrics.csv"), args.warmup_steps, B * T))
        row["shapes"] = safetensors_shapes(os.path.join(out_dir, "model.safetensors"))
        row["params"] = sum(math.prod(s) for s in row["shapes"].values())
        with open(os.path.join(out_dir, "config.json")) as f:
            row["config_json"] = json.load(f)
    except Exception as e:
        row["error"] = f"reading the run in {out_dir}: {type(e).__name__}: {e}"
    for name in os.listdir(out_dir) if os.path.isdir(out_dir) else []:
        if name.endswith(".safetensors"):  # the checkpoint: large, and read already
            os.remove(os.path.join(out_dir, name))
    return row


def check_config_json(cj, m):
    """deltagrad's config.json against the model both sides were given: a list of differences"""
    want = {"hidden_size": m["hidden_size"], "num_hidden_layers": m["num_hidden_layers"],
            "num_heads": m["num_heads"], "head_dim": m["head_dim"], "expand_v": m["expand_v"],
            "use_gate": m["use_gate"], "use_short_conv": m["use_short_conv"], "conv_size": m["conv_size"],
            "conv_bias": False, "allow_neg_eigval": False, "norm_eps": m["norm_eps"],
            "intermediate_size": intermediate_size(m), "vocab_size": m["vocab_size"],
            "tie_word_embeddings": m["tie_word_embeddings"], "initializer_range": m["initializer_range"],
            "model_type": "gated_deltanet"}
    return [f"{k}: deltagrad {cj.get(k)!r}, expected {v!r}" for k, v in want.items()
            if not (cj.get(k) == v or (isinstance(v, float) and isinstance(cj.get(k), (int, float))
                                        and math.isclose(cj[k], v, rel_tol=1e-12)))]


# ---- FLA's side ---------------------------------------------------------------------------------


def fla_worker(spec_path, result_path):
    """one FLA training run (a process of its own); writes its result as JSON"""
    with open(spec_path) as f:
        spec = json.load(f)
    res = {}

    def save():
        with open(result_path, "w") as f:
            json.dump(res, f, indent=1)

    if spec.get("fla_path"):
        sys.path.insert(0, os.path.abspath(spec["fla_path"]))
    os.environ.setdefault("FLA_TILELANG", "0")  # FLA's Triton kernels, its default backend
    import torch
    import triton
    import fla
    import fla.ops.common.chunk_o as fla_chunk_o
    from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

    # FLA refuses the gated backward on Hopper with Triton >= 3.4 (0.5.2: and < 3.7.1; its issue
    # #640); as bench/fla_side_by_side.py does, the guard is switched off in this process only
    guard_on = bool(getattr(fla_chunk_o, "IS_NVIDIA_HOPPER", False)
                    and getattr(fla_chunk_o, "TRITON_ABOVE_3_4_0", False)
                    and not getattr(fla_chunk_o, "TRITON_ABOVE_3_7_1", False))
    if guard_on and hasattr(fla_chunk_o, "TRITON_ABOVE_3_7_1"):
        fla_chunk_o.TRITON_ABOVE_3_7_1 = True
    elif guard_on:  # 0.5.0 and 0.5.1, where chunk_o reads this flag only in the guard
        fla_chunk_o.TRITON_ABOVE_3_4_0 = False
    res.update({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
                "triton": triton.__version__, "fla": getattr(fla, "__version__", "?"),
                "fla_file": os.path.dirname(fla.__file__), "fla_hopper_guard_640_off": guard_on})
    dev = torch.device("cuda")
    torch.manual_seed(spec["seed"])
    torch.cuda.reset_peak_memory_stats()
    model = GatedDeltaNetForCausalLM(GatedDeltaNetConfig(**spec["fla_config"])).to(dev)
    model.train()
    named = list(model.named_parameters())
    res["shapes"] = {n: list(p.shape) for n, p in named}
    res["params"] = sum(p.numel() for _, p in named)
    res["param_dtype"] = str(named[0][1].dtype)
    save()  # the shapes first: a failure below still lets the driver compare the models
    t = spec["train"]
    groups = [{"params": [p for n, p in named if decays(n)], "weight_decay": t["weight_decay"]},
              {"params": [p for n, p in named if not decays(n)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["adam_eps"], fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, spec["steps"]) / t["lr"])
    params = [p for _, p in named]
    B, T, V = spec["batch"], spec["seq_len"], spec["fla_config"]["vocab_size"]
    gen = torch.Generator(device=dev)
    gen.manual_seed(spec["seed"])
    if spec["data"]:
        with open(spec["data"], "rb") as f:
            raw = f.read()
        train = torch.frombuffer(bytearray(raw[:int(len(raw) * 0.9)]), dtype=torch.uint8).to(dev)
        if train.numel() <= T:
            raise SystemExit(f"fla_worker: {spec['data']} is too short for sequences of {T}")
        span = torch.arange(T, device=dev)

        def batch():
            start = torch.randint(0, train.numel() - T, (B, 1), device=dev, generator=gen)
            return train[start + span].long()
    else:
        def batch():
            return torch.randint(0, V, (B, T), device=dev, generator=gen)

    def autocast():
        if spec["precision"] == "bf16":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    n, warm = spec["steps"], spec["warmup_steps"]
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    losses = []
    ev[0].record()
    for i in range(n):
        x = batch()
        with autocast():
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        if t["clip"] > 0:
            torch.nn.utils.clip_grad_norm_(params, t["clip"])
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        ev[i + 1].record()
    torch.cuda.synchronize()
    times = [ev[i].elapsed_time(ev[i + 1]) for i in range(n)]  # ms a step
    timed = times[warm:]
    ms = sum(timed) / len(timed)
    res.update({"ms_per_step": ms, "median_ms_per_step": statistics.median(timed), "step_ms": times,
                "tokens_per_s": B * T / (ms / 1000), "loss_first": losses[0].item(), "loss_last": losses[-1].item(),
                "peak_mib": torch.cuda.max_memory_allocated() / 2**20,
                "peak_reserved_mib": torch.cuda.max_memory_reserved() / 2**20})
    save()


def run_fla(key, cfg, args, data):
    m = model_of(cfg)
    spec = {"fla_config": fla_config(m, not args.fla_unfused), "train": TRAIN, "seed": TRAIN["seed"],
            "steps": args.steps, "warmup_steps": args.warmup_steps, "precision": args.precision,
            "batch": args.batch or cfg["batch"], "seq_len": args.seq_len or cfg["seq_len"],
            "data": data if cfg["task"] == "text" else None, "fla_path": args.fla_path}
    spec_path = os.path.join(args.out, "logs", f"{key}-fla.spec.json")
    result_path = os.path.join(args.out, "logs", f"{key}-fla.result.json")
    log_path = os.path.join(args.out, "logs", f"{key}-fla.log")
    with open(spec_path, "w") as f:
        json.dump(spec, f, indent=1)
    if os.path.exists(result_path):
        os.remove(result_path)
    log(f"[{key}] FLA: GatedDeltaNetForCausalLM, batch {spec['batch']} x {spec['seq_len']}, {args.steps} steps")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    rc, secs, tail = run_logged([sys.executable, os.path.abspath(__file__), "--fla-worker", spec_path, result_path],
                                log_path, args.timeout, env)
    row = {"side": "FLA", "wall_s": round(secs, 1), "log": log_path,
           "precision": "bf16 autocast" if args.precision == "bf16" else "f32"}
    if os.path.exists(result_path):
        with open(result_path) as f:
            row.update(json.load(f))
    if rc != 0 or "ms_per_step" not in row:
        row["error"] = failure(rc, args.timeout, tail, log_path)
    return row


def fla_preflight(args):
    """fails early and clearly when python3 lacks torch, Triton, transformers, FLA or a GPU"""
    code = ("import os, sys\n"
            + (f"sys.path.insert(0, {os.path.abspath(args.fla_path)!r})\n" if args.fla_path else "")
            + "os.environ.setdefault('FLA_TILELANG', '0')\n"
              "import torch, triton, transformers\n"
              "assert torch.cuda.is_available(), 'torch sees no GPU'\n"
              "import fla\nfrom fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM\n"
              "print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', "
              "transformers.__version__, 'fla', getattr(fla, '__version__', '?'), os.path.dirname(fla.__file__), "
              "torch.cuda.get_device_name(0))\n")
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                           preexec_fn=_die_with_parent)
    except subprocess.TimeoutExpired:
        die("importing torch and FLA took over 180 s; giving up")
    if r.returncode != 0:
        die("the FLA side needs python3 with torch (and a GPU), triton, transformers and "
            "flash-linear-attention (import fla): " + (r.stderr.strip().splitlines() or ["?"])[-1]
            + "\n(--skip-fla runs deltagrad alone; --fla-path DIR uses the fla/ package in DIR)")
    return r.stdout.strip()


# ---- the data and the table ----------------------------------------------------------------------


def text_file(path):
    """a deterministic ~4 MiB byte file: words from a fixed list in seeded order, as text"""
    if os.path.exists(path) and os.path.getsize(path) >= TEXT_BYTES:
        return path
    words = ("the of and to in is that for it as was with be by on not he this are or his from at which but "
             "have an they you were her she there been one all we their has would when if so no what out up "
             "delta rule gated state chunk kernel memory token sequence linear attention recurrence").split()
    rng = random.Random(20261127)
    parts, n = [], 0
    while n < TEXT_BYTES:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(6, 18))).capitalize() + ".\n"
        parts.append(line)
        n += len(line)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("".join(parts))
    os.replace(tmp, path)
    return path


def fmt(x, spec):
    return format(x, spec) if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def main():
    args = parse()
    if args.fla_worker:
        fla_worker(*args.fla_worker)
        return 0
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, _on_signal)
    args.out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="train_side_by_side_"))
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    log(f"results in {args.out}")
    if not os.access(args.deltagrad, os.X_OK):
        die(f"no deltagrad binary at {args.deltagrad} (scons -j cuda=1, or --deltagrad PATH)")
    args.deltagrad = os.path.abspath(args.deltagrad)
    try:
        helptext = subprocess.run([args.deltagrad, "train", "--help"], capture_output=True, text=True,
                                  timeout=60).stdout
    except subprocess.TimeoutExpired:
        die("deltagrad train --help did not answer in 60 s")
    precision_flag = "--precision" in helptext
    if not precision_flag and not args.device_cpu_smoke:
        log(f"note: {args.deltagrad} has no --precision option: deltagrad runs in its default (f32); "
            "its rows say so")
    env = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "deltagrad": args.deltagrad,
           "steps": args.steps, "warmup_steps": args.warmup_steps, "precision": args.precision,
           "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR", "(default)")}
    try:
        env["deltagrad_commit"] = subprocess.run(["git", "log", "-1", "--format=%h %s"], capture_output=True,
                                                 text=True, timeout=10).stdout.strip()[:100]
        env["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        env.setdefault("gpu", "?")
    if not args.skip_fla:
        env["python_side"] = fla_preflight(args)
        log("FLA side:", env["python_side"])
    needs_text = any(CONFIGS[k]["task"] == "text" for k in args.config_list)
    data = text_file(os.path.join(args.out, "text_4mib.txt")) if needs_text else None

    results = []
    for key in args.config_list:
        cfg = CONFIGS[key]
        m = model_of(cfg)
        entry = {"config": key, "name": cfg["name"], "task": cfg["task"], "batch": args.batch or cfg["batch"],
                 "seq_len": args.seq_len or cfg["seq_len"], "model": m, "intermediate_size": intermediate_size(m),
                 "rows": []}
        results.append(entry)
        dg = run_deltagrad(key, cfg, args, data, precision_flag)
        entry["rows"].append(dg)
        if "config_json" in dg:
            diff = check_config_json(dg["config_json"], m)
            if diff:
                dg["error"] = "deltagrad's config.json differs from the configuration: " + "; ".join(diff)
        if args.also_no_graph and not args.device_cpu_smoke:
            ng = run_deltagrad(key, cfg, args, data, precision_flag, extra=("--no-graph",))
            if "error" not in dg and "error" not in ng:
                ng["note"] = f"the CUDA graph's rate is {dg['tokens_per_s'] / ng['tokens_per_s']:.2f}x this"
            entry["rows"].append(ng)
        if not args.skip_fla:
            fl = run_fla(key, cfg, args, data)
            entry["rows"].append(fl)
            if "shapes" in dg and "shapes" in fl:
                if dg["shapes"] != fl["shapes"]:
                    only_dg = sorted(set(dg["shapes"]) - set(fl["shapes"]))[:4]
                    only_fla = sorted(set(fl["shapes"]) - set(dg["shapes"]))[:4]
                    other = [n for n in dg["shapes"] if n in fl["shapes"] and dg["shapes"][n] != fl["shapes"][n]][:4]
                    entry["model_mismatch"] = (f"parameters: deltagrad {dg['params']}, FLA {fl['params']}; only in "
                                               f"deltagrad {only_dg}, only in FLA {only_fla}, other shapes {other}")
                    fl["error"] = "not the same model: " + entry["model_mismatch"]
                entry["params_match"] = dg["params"] == fl["params"] and dg["shapes"] == fl["shapes"]
            if "error" not in dg and "error" not in fl:
                entry["ratio_tokens_per_s"] = dg["tokens_per_s"] / fl["tokens_per_s"]
                if dg.get("peak_mib") and fl.get("peak_mib"):
                    entry["ratio_peak_mib"] = dg["peak_mib"] / fl["peak_mib"]
        for r in entry["rows"]:
            if "error" in r:
                log(f"[{key}] {r['side']} FAILED: {r['error']}")
            else:
                log(f"[{key}] {r['side']}: {fmt(r['tokens_per_s'], ',.0f')} tokens/s, "
                    f"{fmt(r['ms_per_step'], '.2f')} ms/step, peak {fmt(r.get('peak_mib'), '.0f')} MiB, "
                    f"{r.get('params', 0) / 1e6:.2f} M parameters, loss {fmt(r['loss_first'], '.3f')} -> "
                    f"{fmt(r['loss_last'], '.3f')} ({r['wall_s']} s)")
        write_results(args, env, results, show=False)  # what is done so far, should a later run hang
    failed = write_results(args, env, results, show=True)
    return 1 if failed else 0


def write_results(args, env, results, show):
    """writes the table (and prints it when show); the number of failed runs"""
    cols = ["config", "params_M", "batch_x_seq", "side", "precision", "tokens_per_s", "ms_per_step",
            "median_ms_per_step", "peak_gpu_mib", "dg_over_fla_tokens_per_s", "dg_over_fla_peak_mib", "loss_first",
            "loss_last", "note"]
    table, failed = [], 0
    for e in results:
        for r in e["rows"]:
            dg = r["side"] == "deltagrad"
            note = r.get("error", "")[:300].replace("\n", " ").replace("|", "/")
            failed += bool(note)
            if r.get("note"):
                note = (note + "; " if note else "") + r["note"]
            if not dg and r.get("fla_hopper_guard_640_off"):
                note = (note + "; " if note else "") + "FLA #640 Hopper guard switched off"
            table.append({"config": f"{e['config']} ({e['name']}, {e['task']})",
                          "params_M": fmt(r.get("params", float("nan")) / 1e6, ".2f"),
                          "batch_x_seq": f"{e['batch']}x{e['seq_len']}", "side": r["side"],
                          "precision": r["precision"], "tokens_per_s": fmt(r.get("tokens_per_s"), ".0f"),
                          "ms_per_step": fmt(r.get("ms_per_step"), ".2f"),
                          "median_ms_per_step": fmt(r.get("median_ms_per_step"), ".2f"),
                          "peak_gpu_mib": fmt(r.get("peak_mib"), ".0f"),
                          "dg_over_fla_tokens_per_s": fmt(e.get("ratio_tokens_per_s"), ".2f") if dg else "",
                          "dg_over_fla_peak_mib": fmt(e.get("ratio_peak_mib"), ".2f") if dg else "",
                          "loss_first": fmt(r.get("loss_first"), ".3f"), "loss_last": fmt(r.get("loss_last"), ".3f"),
                          "note": note})
    with open(os.path.join(args.out, "train_side_by_side.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(table)
    fla_loss = "nn.CrossEntropyLoss, unfused modules" if args.fla_unfused else "labels + its fused cross-entropy"
    head = (f"{env.get('gpu', '?')}; {env.get('python_side', 'FLA skipped')}; "
            f"deltagrad {env.get('deltagrad_commit', '?')}; {env['date_utc']} UTC\n"
            f"{args.steps} steps a run, the first {args.warmup_steps} left out of the rate; "
            f"ms/step: the mean of the rest (deltagrad: metrics.csv elapsed_s; FLA: CUDA events); "
            f"peak: deltagrad's metrics.csv peak (its tensor bytes), FLA's torch.cuda.max_memory_allocated; "
            f"FLA loss: {fla_loss}\n")
    md = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    md += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in table]
    with open(os.path.join(args.out, "train_side_by_side.md"), "w") as f:
        f.write(head + "\n" + "\n".join(md) + "\n")
    with open(os.path.join(args.out, "train_side_by_side.json"), "w") as f:
        json.dump({"environment": env, "configs": results}, f, indent=1, default=str)
    if not show:
        return failed
    short = ["config", "params_M", "batch_x_seq", "side", "precision", "tokens_per_s", "ms_per_step", "peak_gpu_mib",
             "dg_over_fla_tokens_per_s"]
    width = {c: max(len(c), *(len(r[c]) for r in table)) if table else len(c) for c in short}
    log("\n" + head)
    log("  ".join(c.ljust(width[c]) for c in short))
    for r in table:
        log("  ".join(r[c].ljust(width[c]) for c in short) + ("  " + r["note"][:120] if r["note"] else ""))
    return failed


if __name__ == "__main__":
    sys.exit(main())
