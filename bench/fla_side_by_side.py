#!/usr/bin/env python3
"""flash-linear-attention (FLA) and deltagrad's CUDA kernels side by side, on the same inputs.

For each case (op x shape) this script draws the inputs on the GPU with torch, writes them to a
safetensors file, times FLA's chunk_gated_delta_rule / chunk_kda / chunk_delta_rule on them with
use_qk_l2norm_in_kernel=True (triton.testing.do_bench: warm-up, median, L2 flushed before every
call), keeps FLA's output and gradients, then runs `deltagrad bench --device cuda --inputs FILE
--dump --json ...` on the same file (the same numbers; CUDA events, warm-up, median, L2 flushed;
the L2 norm of q, k included, tools/bench_cuda.c) and compares deltagrad's outputs and gradients
with FLA's (relative difference ||ours - FLA|| / ||FLA||: two 16-bit implementations, so about
1e-3..1e-2 is expected in bf16, less in fp16; it shows that both time the same function).  Prints one table: op, shape,
FLA ms, ours ms, FLA / ours, forward and forward+backward.

Inputs (as FLA's own benchmark registry draws them): q, k, v, do ~ N(0,1) [B,T,H,K];
beta = sigmoid(N(0,1)) [B,T,H], all five bf16 at S1 and S2 and fp16 at S3 (the default dtypes;
--dtype bf16|f16 puts every case in one); g = max(logsigmoid(N(0,1)), -5) f32, [B,T,H]
(gated_delta_rule) or [B,T,H,K] (kda).  fwd is timed under torch.no_grad(); fwd+bwd is the forward
with q, k, v, g, beta requiring grad, then o.backward(do), gradients reset to None between calls.
At the state shapes AS, AS2 the inputs also have an initial state h0 and a final state's gradient
dht, both N(0,1) f32 [B,HV,K,V]: each side starts from h0 (FLA's initial_state, h0 requiring grad),
returns the final state hT (output_final_state=True) and takes dht with do in its backward
(torch.autograd.backward([o, hT], [do, dht])); hT and dh0 are compared too.

FLA 0.5.2 refuses the gated backward on Hopper with Triton < 3.7.1 (its issue #640: wrong dg /
dbeta from chunk_bwd_dqkwg on Triton 3.4..3.7.0).  To time it, this script switches that guard off
for this process only (fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True; FLA's files are not
edited) and marks the numbers that ran with it off.  The cross-check column says whether FLA's
gradients then agree with ours.

--f64 measures the accuracy bar (a 16-bit path no worse than FLA against the f64 reference on the same
inputs): for each case it also runs the op's token-by-token recurrence in float64 on the GPU
(delta_recurrence below: plain PyTorch, autograd for the gradients; neither FLA's code nor ours) on the
same 16-bit inputs, upcast, and records err_f64_ours[n] and err_f64_fla[n] = ||x - ref|| / ||ref|| for
n in o, dq, dk, dv, dbeta, dg (and hT, dh0 at AS, AS2); the table gets a column with the largest of each
side.  The reference's autograd keeps one f64 state a step (T*B*HV*K*V*8 bytes): cases above
--f64-max-gb (default 24) are skipped, which the timing shapes S1..S4, L1, Q1 are; the accuracy shapes
A1, A3, A4, AL (B1 T1024, the heads, K, V and dtype of S1, S3, S4, L1) and AS, AS2 (B3, K 256, V 64, bf16,
with h0 and dht: T1, one token, and T130, three chunks of 64, the last partial) are what it is for.

Usage (on the GPU machine; bench/gpu_side_by_side.sh runs it):
  python3 bench/fla_side_by_side.py --deltagrad PATH/deltagrad --fla third_party_fla --out DIR
  python3 bench/fla_side_by_side.py ... --shapes A1,A3,A4,AL --f64    (ours and FLA against f64)
  python3 bench/fla_side_by_side.py ... --shapes AS,AS2 --ops gated_delta_rule,delta_rule --f64
                                                                       (the same, with h0 and dht)
Set TRITON_CACHE_DIR to keep Triton's compiled kernels and autotuning results between runs.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

# B, T, H, K, V.  S1-S3: the reference shapes (the default); S4 (with --shapes S4): FLA's layer default
# V = 2K, gated_delta_rule and kda, which our kernels run as two heads of V = 128 sharing the work that
# does not depend on V (kernels/cuda/delta/dr_chunk_vsplit.cu); L1 (with
# --shapes L1): FLA's GatedDeltaNet layer as it comes (head_dim 256, expand_v 2, 6 heads) at B4 T4096, and
# delta_rule and kda at its heads (K = 256: ours runs both on the K = 256 kernels);
# Q1 (with --shapes Q1): Qwen3-Next's grouped value heads, 16 key heads and 32 value heads of 128, at
# B4 T4096 (FLA's layer repeats q and k over each group of value heads before its kernels: so does
# the FLA side here, inside the timed call).  A1, A3, A4, AL (with --shapes A1,A3,A4,AL --f64): accuracy
# shapes, B1 T1024, small enough for the f64 reference (--f64-max-gb), each with the heads, K, V and
# dtype of a timing shape (A1 as S1: GDN, DeltaNet, KDA; A3 as S3: K = V = 256, fp16; A4 as S4: V = 2K,
# the split heads; AL as L1: K 256, V 512), so that the timed kernels run: FLA autotunes by H, HV, K, V (not B or T), so the timing shapes'
# choices serve; ours pick kernels by K, V, the gate and the dtype, except that at A1 and A4 (N * HV * V / 64
# below the SM count) the K = 128 state and dhu passes take 32-wide V tiles where S1 takes 64-wide ones.
# AS, AS2 (with --shapes AS,AS2 --f64; gated_delta_rule and delta_rule): accuracy shapes with an
# initial state h0 and a final state's gradient dht (H0_SHAPES), B3 H4 K 256 V 64 bf16, at T1 (one
# token) and T130 (three chunks of 64, the last partial); their times mean nothing.  O1 (with --shapes O1):
# a head size neither side's kernels take as it is, K = V = 96, every op (FLA masks its tiles of 128; ours pads
# K, V to 128 with zeros around its kernels, kernels/cuda/delta/dr_chunk_pad.cu), and AO its accuracy shape.
# R1 (with --shapes R1): S1's 16384 tokens packed as 12 sequences of mixed lengths (SEQLENS: cu_seqlens,
# B = 1; the lengths of tools/bench_cuda_case.c), every op; AR its accuracy shape (1024 tokens as 7
# sequences from 1 to 501 tokens).  K1 (with --shapes K1): small heads, K = V = 64, every op; AK its
# accuracy shape.
SHAPES = {"S1": (8, 2048, 16, 128, 128), "S2": (2, 8192, 16, 128, 128), "S3": (16, 4096, 8, 256, 256),
          "S4": (8, 2048, 16, 128, 256), "L1": (4, 4096, 6, 256, 512), "Q1": (4, 4096, 16, 128, 128),
          "A1": (1, 1024, 16, 128, 128), "A3": (1, 1024, 8, 256, 256), "A4": (1, 1024, 16, 128, 256),
          "AL": (1, 1024, 6, 256, 512),
          "AS": (3, 1, 4, 256, 64), "AS2": (3, 130, 4, 256, 64), "O1": (8, 2048, 16, 96, 96),
          "AO": (1, 1024, 16, 96, 96), "R1": (1, 16384, 16, 128, 128), "AR": (1, 1024, 16, 128, 128),
          "K1": (8, 2048, 16, 64, 64), "AK": (1, 1024, 16, 64, 64)}
# packed sequences (cu_seqlens, B = 1): their lengths, summing to T
SEQLENS = {"R1": [1000, 37, 2500, 129, 3000, 64, 1, 777, 2048, 1500, 1232, 4096],
           "AR": [1, 63, 64, 65, 130, 200, 501]}
VALUE_HEADS = {"Q1": 32}  # value heads where they are not the key heads' H
DTYPES = {"S1": "bf16", "S2": "bf16", "S3": "f16", "S4": "bf16", "L1": "bf16", "Q1": "bf16",
          "A1": "bf16", "A3": "f16", "A4": "bf16", "AL": "bf16", "AS": "bf16", "AS2": "bf16", "O1": "bf16",
          "AO": "bf16", "R1": "bf16", "AR": "bf16", "K1": "bf16", "AK": "bf16"}
H0_SHAPES = {"AS", "AS2"}  # shapes whose inputs have h0 and dht, f32 [B,HV,K,V]
CASES = [("gated_delta_rule", "S1"), ("delta_rule", "S1"), ("kda", "S1"),
         ("gated_delta_rule", "S2"), ("delta_rule", "S2"), ("kda", "S2"),
         ("gated_delta_rule", "S3"), ("gated_delta_rule", "S4"), ("kda", "S4"), ("gated_delta_rule", "L1"),
         ("delta_rule", "L1"), ("kda", "L1"), ("gated_delta_rule", "Q1"),
         ("gated_delta_rule", "A1"), ("delta_rule", "A1"), ("kda", "A1"),
         ("gated_delta_rule", "A3"), ("gated_delta_rule", "A4"), ("kda", "A4"),
         ("gated_delta_rule", "AL"), ("kda", "AL"),
         ("gated_delta_rule", "AS"), ("delta_rule", "AS"), ("gated_delta_rule", "AS2"), ("delta_rule", "AS2"),
         ("gated_delta_rule", "O1"), ("delta_rule", "O1"), ("kda", "O1"),
         ("gated_delta_rule", "AO"), ("delta_rule", "AO"), ("kda", "AO"),
         ("gated_delta_rule", "R1"), ("delta_rule", "R1"), ("kda", "R1"),
         ("gated_delta_rule", "AR"), ("delta_rule", "AR"), ("kda", "AR"),
         ("gated_delta_rule", "K1"), ("delta_rule", "K1"), ("kda", "K1"),
         ("gated_delta_rule", "AK"), ("delta_rule", "AK"), ("kda", "AK")]
# the outputs and gradients compared, each where a side has it: dg with a gate, hT and dh0 at H0_SHAPES
GRAD_NAMES = ["o", "dq", "dk", "dv", "dbeta", "dg", "hT", "dh0"]


def log(*a):
    print(*a, flush=True)


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deltagrad", default=None, help="the deltagrad binary (default: .gpu-bench/deltagrad, "
                    "else build/release/deltagrad)")
    ap.add_argument("--fla", default="third_party_fla", help="folder holding FLA's fla/ package")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="results folder (default: $OUT, else a new "
                    "temporary folder)")
    ap.add_argument("--work", default=None, help="folder for the input files (default: a new temporary folder)")
    ap.add_argument("--shapes", default="S1,S2,S3")
    ap.add_argument("--dtype", choices=["bf16", "f16"], default=None,
                    help="every case in this dtype (default: bf16 at S1, S2, S4; fp16 at S3)")
    ap.add_argument("--ops", default="gated_delta_rule,kda,delta_rule")
    ap.add_argument("--warmup", type=float, default=100, help="do_bench warm-up, ms")
    ap.add_argument("--rep", type=float, default=400, help="do_bench repetition time, ms")
    ap.add_argument("--kda-safe-gate", action="store_true",
                    help="also time FLA's chunk_kda with safe_gate=True, lower_bound=-5 (its bounded-gate fast "
                         "mode; the inputs satisfy g >= -5; more autotuning)")
    ap.add_argument("--ours-timeout", type=float, default=120, help="seconds for one deltagrad call")
    ap.add_argument("--seed", type=int, default=20261122)
    ap.add_argument("--f64", action="store_true",
                    help="also compute each case's op in float64 on the GPU (token-by-token recurrence, autograd) "
                         "from the same 16-bit inputs and report ours and FLA against it (the accuracy bar)")
    ap.add_argument("--f64-max-gb", type=float, default=24,
                    help="skip the f64 reference where its autograd would keep more than this many GB (one f64 "
                         "state a step: T*B*HV*K*V*8 bytes)")
    return ap.parse_args()


def rel(a, b):
    """||a - b|| / ||b|| in float64 (b is FLA's, or the f64 reference's)"""
    import torch
    a = a.double()
    b = b.double()
    nb = torch.linalg.vector_norm(b).item()
    return torch.linalg.vector_norm(a - b).item() / nb if nb > 0 else float("nan")


def worst(d):
    """'1.7e-03 (dk)': the largest of a dict of relative errors and its name (non-finite counts as largest)"""
    if not d:
        return "-"
    n, x = max(d.items(), key=lambda kv: kv[1] if math.isfinite(kv[1]) else float("inf"))
    return f"{x:.1e} ({n})"


# ---- the f64 reference (--f64) ----------------------------------------------------------------------
def delta_recurrence(op, q, k, v, beta, g=None, qk_l2norm=True, h0=None):
    """o [B,T,HV,V] and the final state S_T [B,HV,K,V] of op ("gated_delta_rule", "kda" or "delta_rule")
    by the token-by-token recurrence, in the inputs' dtype and on their device, differentiable (autograd
    gives the gradients).  q, k [B,T,H,K]; v [B,T,HV,V]; beta [B,T,HV]; g [B,T,HV] (gated_delta_rule) or
    [B,T,HV,K] (kda), log-gates, None for delta_rule; h0 [B,HV,K,V], the initial state, or None (zeros).
    FLA's conventions: q, k L2-normalised per row (x / sqrt(sum x^2 + 1e-6), as FLA's l2norm) unless
    qk_l2norm is False, scale K ** -0.5, value head h reads key head h // (HV / H), S_0 = h0 or 0; for
    each t (D_t = exp(g_t) I, diag(exp(g_t)), or I):
        S <- D_t S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = scale S^T q_t
    The state is [B,HV,K,V], one loop over t.  S^T (D_t k_t) is taken from the state before its decay
    ((D_t S)^T k = S^T D_t k, D_t diagonal), so that autograd keeps one state a step (the new S, which
    o_t and the next step both read), not two."""
    import torch
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if qk_l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    if HV != H:
        q, k = q.repeat_interleave(HV // H, dim=2), k.repeat_interleave(HV // H, dim=2)
    scale = K ** -0.5
    S = h0 if h0 is not None else q.new_zeros(B, HV, K, V)
    o = []
    for t in range(T):
        kt, qt, vt, bt = k[:, t], q[:, t], v[:, t], beta[:, t]  # [B,HV,K], [B,HV,K], [B,HV,V], [B,HV]
        if op == "gated_delta_rule":
            dec = g[:, t].exp()  # [B,HV]
            sk = dec[..., None] * (kt.unsqueeze(-2) @ S).squeeze(-2)  # (D S)^T k, [B,HV,V]
            S = S * dec[..., None, None]
        elif op == "kda":
            dec = g[:, t].exp()  # [B,HV,K]
            sk = ((dec * kt).unsqueeze(-2) @ S).squeeze(-2)
            S = S * dec[..., None]
        elif op == "delta_rule":
            sk = (kt.unsqueeze(-2) @ S).squeeze(-2)
        else:
            raise ValueError(f"delta_recurrence: unknown op {op}")
        u = bt[..., None] * (vt - sk)  # [B,HV,V]
        S = S + kt[..., :, None] * u[..., None, :]
        o.append(scale * (qt.unsqueeze(-2) @ S).squeeze(-2))
    return torch.stack(o, dim=1), S


def f64_reference_bytes(B, T, HV, K, V):
    """what the reference's autograd keeps, about: one f64 state [B,HV,K,V] a step (delta_recurrence; the
    vectors it also keeps a step add about 10 % at K = V = 128, less at larger K, V)"""
    return T * B * HV * K * V * 8


def f64_reference(op, q, k, v, beta, g, do, device, h0=None, dht=None, cu=None):
    """o, dq, dk, dv, dbeta (and dg unless delta_rule) of op in float64 on device (the inputs upcast from
    whatever they are; the gradients of sum(o * do) + sum(hT * dht), with respect to the un-normalised
    q, k), as CPU float64 tensors keyed by GRAD_NAMES; from the initial state h0 where given (then also
    dh0), and the final state hT where h0 or dht is given; cu (a list of offsets, B = 1): packed
    sequences, each run by itself"""
    import torch

    def up(t):
        return t.detach().to(device=device, dtype=torch.float64)

    leaves = [up(t).requires_grad_(True) for t in ((q, k, v, beta) + ((g,) if g is not None else ()))]
    lq, lk, lv, lb = leaves[:4]
    lg = leaves[4] if g is not None else None
    lh0 = up(h0).requires_grad_(True) if h0 is not None else None
    if cu is None:
        o, hT = delta_recurrence(op, lq, lk, lv, lb, lg, h0=lh0)
    else:  # packed sequences: each from a zero state (B = 1; h0, dht are not taken with cu_seqlens here)
        o = torch.cat([delta_recurrence(op, lq[:, a:b], lk[:, a:b], lv[:, a:b], lb[:, a:b],
                                        lg[:, a:b] if lg is not None else None)[0]
                       for a, b in zip(cu[:-1], cu[1:])], dim=1)
        hT = None
    outs, grads = [o], [up(do)]
    if dht is not None:
        outs.append(hT)
        grads.append(up(dht))
    torch.autograd.backward(outs, grads)
    ref = {"o": o.detach().cpu(), "dq": lq.grad.cpu(), "dk": lk.grad.cpu(), "dv": lv.grad.cpu(),
           "dbeta": lb.grad.cpu()}
    if lg is not None:
        ref["dg"] = lg.grad.cpu()
    if h0 is not None or dht is not None:
        ref["hT"] = hT.detach().cpu()
    if lh0 is not None:
        ref["dh0"] = lh0.grad.cpu()
    return ref


def main():
    args = parse()
    if not args.out:
        args.out = tempfile.mkdtemp(prefix="fla_side_by_side_")
    if not args.work:
        args.work = tempfile.mkdtemp(prefix="fla_side_by_side_inputs_")
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    log(f"results in {args.out}, inputs in {args.work}")
    fla_dir = os.path.abspath(args.fla)
    if not os.path.isdir(os.path.join(fla_dir, "fla")):
        sys.exit(f"fla_side_by_side: no fla/ package under {fla_dir} (bash bench/gpu_side_by_side.sh prepare)")
    sys.path.insert(0, fla_dir)
    os.environ.setdefault("FLA_TILELANG", "0")  # the Triton kernels, as FLA ships them by default elsewhere
    binary = args.deltagrad
    if binary is None:
        binary = next((p for p in (".gpu-bench/deltagrad", "build/release/deltagrad") if os.path.exists(p)), None)
    if binary is None or not os.path.exists(binary):
        sys.exit("fla_side_by_side: no deltagrad binary (--deltagrad PATH)")

    import torch
    import torch.nn.functional as F
    import triton
    import triton.testing
    from safetensors.torch import load_file, save_file

    import fla
    import fla.ops.common.chunk_o as fla_chunk_o
    from fla.ops.delta_rule import chunk_delta_rule
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.kda import chunk_kda

    guard_on = bool(getattr(fla_chunk_o, "IS_NVIDIA_HOPPER", False) and getattr(fla_chunk_o, "TRITON_ABOVE_3_4_0", False)
                    and not getattr(fla_chunk_o, "TRITON_ABOVE_3_7_1", True))
    if guard_on:
        fla_chunk_o.TRITON_ABOVE_3_7_1 = True  # FLA issue #640 guard off, this process only
    fla_commit = ""
    vfile = os.path.join(fla_dir, "VERSION")
    if os.path.exists(vfile):
        fla_commit = open(vfile).read().strip()
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        driver = "?"
    env = {"device": torch.cuda.get_device_name(0), "driver": driver, "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "triton": triton.__version__,
           "fla": getattr(fla, "__version__", "?"), "fla_source": fla_commit,
           "fla_hopper_guard_640": "switched off for this run" if guard_on else "not active (nothing switched off)",
           "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
           "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR", "(default)")}
    log("environment:", json.dumps(env))

    def fla_call(op, q, k, v, g, beta, safe=False, h0=None, cu=None):
        """FLA's (o, hT): hT the final state when h0 (the initial state) is given, else None; cu: the
        packed sequences' offsets (FLA's cu_seqlens, a LongTensor on the GPU) or None"""
        if v.shape[2] != q.shape[2]:  # grouped value heads: q, k repeated over each group, as FLA's layer
            grp = v.shape[2] // q.shape[2]
            q, k = q.repeat_interleave(grp, dim=2), k.repeat_interleave(grp, dim=2)
        st = {"initial_state": h0, "output_final_state": h0 is not None, "cu_seqlens": cu}
        if op == "gated_delta_rule":
            return chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, **st)
        if op == "kda":
            extra = {"safe_gate": True, "lower_bound": -5.0} if safe else {}
            return chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, **st, **extra)
        return chunk_delta_rule(q, k, v, beta, use_qk_l2norm_in_kernel=True, **st)

    def bench(fn, grads=None):
        return triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep, grad_to_none=grads,
                                       return_mode="median")

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")

    def device_us(fn, n, by_name=None):
        """the summed durations of the GPU work (kernels, memsets, copies) of n calls of fn, us; by_name
        (a dict) also gets them summed by kernel name"""
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
        total = 0.0
        for e in prof.events():
            if e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False):
                continue
            us = e.time_range.elapsed_us()
            total += us
            if by_name is not None:
                by_name[e.name] = by_name.get(e.name, 0.0) + us
        return total

    def kernels_ms(fn, grads=None, n=10, by_name=None):
        """FLA's GPU work alone, ms a call: the sum of its kernels' durations (torch.profiler), the L2
        flushed before each call as do_bench does (the flush's own time taken off).  It leaves out the
        gaps between the kernels, where the GPU waits for the host to launch the next one (Python and
        Triton's launch path): what do_bench's time would be with those gaps closed, a lower bound."""
        def one():
            flush.zero_()
            fn()
            if grads:
                for t in grads:
                    t.grad = None
        one()
        names = {}
        total = device_us(one, n, names)
        flush_names = {}
        total -= device_us(flush.zero_, n, flush_names)
        if by_name is not None:  # us a call by kernel name, the flush's taken off, largest first
            for k2, v2 in flush_names.items():
                names[k2] = names.get(k2, 0.0) - v2
            by_name.update(sorted(((k2, v2 / n) for k2, v2 in names.items() if v2 / n >= 0.5),
                                  key=lambda kv: -kv[1]))
        return total / n / 1000.0

    want_shapes = set(args.shapes.split(","))
    want_ops = set(args.ops.split(","))
    rows = []
    t_start = time.time()
    for ci, (op, shape) in enumerate(CASES):
        if shape not in want_shapes or op not in want_ops:
            continue
        B, T, H, K, V = SHAPES[shape]
        HV = VALUE_HEADS.get(shape, H)
        dname = args.dtype or DTYPES[shape]
        dt = torch.float16 if dname == "f16" else torch.bfloat16
        row = {"op": op, "shape": shape, "B": B, "T": T, "H": H, "HV": HV, "K": K, "V": V, "dtype": dname,
               "fla_guard_off": guard_on and op == "gated_delta_rule"}
        rows.append(row)
        t0 = time.time()
        gen = torch.Generator(device="cuda")
        gen.manual_seed(args.seed + ci)
        dev = "cuda"
        q = torch.randn(B, T, H, K, device=dev, dtype=dt, generator=gen)
        k = torch.randn(B, T, H, K, device=dev, dtype=dt, generator=gen)
        v = torch.randn(B, T, HV, V, device=dev, dtype=dt, generator=gen)
        do = torch.randn(B, T, HV, V, device=dev, dtype=dt, generator=gen)
        beta = torch.randn(B, T, HV, device=dev, dtype=torch.float32, generator=gen).sigmoid().to(dt)
        g = None
        if op != "delta_rule":
            gshape = (B, T, HV) if op == "gated_delta_rule" else (B, T, HV, K)
            g = F.logsigmoid(torch.randn(*gshape, device=dev, dtype=torch.float32, generator=gen)).clamp_min(-5.0)
        h0 = dht = None
        if shape in H0_SHAPES:  # the initial state and the final state's gradient, N(0,1) f32
            h0 = torch.randn(B, HV, K, V, device=dev, dtype=torch.float32, generator=gen)
            dht = torch.randn(B, HV, K, V, device=dev, dtype=torch.float32, generator=gen)
        cu_list = cu = None
        if shape in SEQLENS:
            cu_list = [0]
            for n in SEQLENS[shape]:
                cu_list.append(cu_list[-1] + n)
            assert B == 1 and cu_list[-1] == T, f"{shape}: its sequences hold {cu_list[-1]} tokens, T = {T}"
            cu = torch.tensor(cu_list, dtype=torch.int64, device=dev)
        path = os.path.join(args.work, f"{shape}_{op}.safetensors")
        tensors = {"q": q, "k": k, "v": v, "do": do, "beta": beta}
        if cu is not None:
            tensors["cu_seqlens"] = cu
        if g is not None:
            tensors["g"] = g
        if h0 is not None:
            tensors["h0"], tensors["dht"] = h0, dht
        save_file({n: t.contiguous().cpu() for n, t in tensors.items()}, path, metadata={"op": op, "label": shape})

        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        lb = beta.detach().clone().requires_grad_(True)
        lg = g.detach().clone().requires_grad_(True) if g is not None else None
        lh0 = h0.detach().clone().requires_grad_(True) if h0 is not None else None
        grads = leaves + [lb] + ([lg] if lg is not None else []) + ([lh0] if lh0 is not None else [])

        def fwd(safe=False):
            with torch.no_grad():
                fla_call(op, q, k, v, g, beta, safe, h0, cu)

        def fwdbwd(safe=False):
            """FLA's forward and backward; returns (o, hT)"""
            o, ht = fla_call(op, leaves[0], leaves[1], leaves[2], lg, lb, safe, lh0, cu)
            if ht is None:
                o.backward(do)
            else:
                torch.autograd.backward([o, ht], [do, dht])
            return o, ht

        fla_ref = None
        try:
            row["fla_fwd_ms"] = bench(fwd)
            row["fla_fwdbwd_ms"] = bench(fwdbwd, grads)
            try:
                row["fla_kernels_fwd_ms"] = kernels_ms(fwd)
                by_name = {}
                row["fla_kernels_fwdbwd_ms"] = kernels_ms(fwdbwd, grads, by_name=by_name)
                row["fla_kernels_fwdbwd_us_by_name"] = {k2[:90]: round(v2, 1) for k2, v2 in by_name.items()}
                log(f"{op} {shape}: FLA's GPU work a fwd+bwd call, us: "
                    + "; ".join(f"{k2[:60]} {v2:.0f}" for k2, v2 in by_name.items()))
            except Exception as e:  # a profiler that does not work here costs the column, not the run
                row["fla_kernels_error"] = f"{type(e).__name__}: {e}"[:200]
            for t in grads:
                t.grad = None
            o, ht = fwdbwd()
            fla_ref = {"o": o.detach().cpu(), "dq": leaves[0].grad.cpu(), "dk": leaves[1].grad.cpu(),
                       "dv": leaves[2].grad.cpu(), "dbeta": lb.grad.cpu()}
            if lg is not None:
                fla_ref["dg"] = lg.grad.cpu()
            if ht is not None:
                fla_ref["hT"], fla_ref["dh0"] = ht.detach().cpu(), lh0.grad.cpu()
            if op == "kda" and args.kda_safe_gate:
                row["fla_safe_gate_fwd_ms"] = bench(lambda: fwd(True))
                row["fla_safe_gate_fwdbwd_ms"] = bench(lambda: fwdbwd(True), grads)
        except Exception as e:  # FLA failing is a result, not a reason to stop
            row["fla_error"] = f"{type(e).__name__}: {e}"[:300]
            log(f"{op} {shape}: FLA failed: {row['fla_error']}")
        f64_ref = None
        if args.f64:  # the f64 recurrence on the same 16-bit inputs (upcast), autograd for the gradients
            need_gb = f64_reference_bytes(B, T, HV, K, V) / 1e9
            row["f64_autograd_gb"] = need_gb
            if need_gb > args.f64_max_gb:
                row["f64_skipped"] = f"needs {need_gb:.1f} GB > --f64-max-gb {args.f64_max_gb:g}"
                log(f"{op} {shape}: f64 reference skipped: {row['f64_skipped']}")
            else:
                try:
                    tr = time.time()
                    f64_ref = f64_reference(op, q, k, v, beta, g, do, dev, h0, dht, cu_list)
                    row["f64_s"] = time.time() - tr
                    if fla_ref is not None:
                        row["err_f64_fla"] = {n: rel(fla_ref[n], f64_ref[n]) for n in GRAD_NAMES
                                              if n in fla_ref and n in f64_ref}
                except Exception as e:  # as FLA's: a result, not a reason to stop
                    row["f64_error"] = f"{type(e).__name__}: {e}"[:300]
                    log(f"{op} {shape}: f64 reference failed: {row['f64_error']}")
        o = ht = None
        del q, k, v, do, beta, g, h0, dht, leaves, lb, lg, lh0, grads, tensors, o, ht, cu
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        t1 = time.time()

        ours_json = os.path.join(args.work, f"ours_{shape}_{op}.json")
        cmd = [binary, "bench", "--device", "cuda", "--inputs", path, "--dump", "--json", ours_json,
               "--no-ceilings", "--no-variants", "--no-recurrent"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.ours_timeout)
            if res.returncode != 0:
                row["ours_error"] = (res.stdout + res.stderr)[-400:]
            with open(ours_json) as f:
                rec = [r for r in json.load(f)["results"] if r["variant"] == "default"][0]
            row["ours_fwd_ms"] = rec["fwd_ms"]
            row["ours_fwdbwd_ms"] = rec["fwdbwd_ms"]
            row["ours_l2norm_fwdbwd_ms"] = rec["l2norm_fwdbwd_ms"]
            row["ours_nonfinite"] = rec["nonfinite_outputs"]
            os.remove(ours_json)
        except Exception as e:
            row.setdefault("ours_error", f"{type(e).__name__}: {e}"[:400])
        if "ours_error" in row:
            log(f"{op} {shape}: ours failed: {row['ours_error']}")
        dump = path + ".ours.safetensors"
        if os.path.exists(dump):
            ours = load_file(dump)
            if fla_ref is not None:
                row["rel_diff_vs_fla"] = {n: rel(ours[n], fla_ref[n]) for n in GRAD_NAMES if n in ours and n in fla_ref}
            if f64_ref is not None:
                row["err_f64_ours"] = {n: rel(ours[n], f64_ref[n]) for n in GRAD_NAMES if n in ours and n in f64_ref}
            del ours
        for p in (path, dump):
            if os.path.exists(p):
                os.remove(p)
        del fla_ref, f64_ref
        for a in ("fwd", "fwdbwd"):
            f_ms, k_ms, o_ms = row.get(f"fla_{a}_ms"), row.get(f"fla_kernels_{a}_ms"), row.get(f"ours_{a}_ms")
            if f_ms and o_ms:
                row[f"ratio_{a}"] = f_ms / o_ms
            if k_ms and o_ms:
                row[f"ratio_kernels_{a}"] = k_ms / o_ms
        log(f"{op} {shape}: " + json.dumps({k2: (round(v2, 4) if isinstance(v2, float) else v2)
                                             for k2, v2 in row.items() if k2 not in ("B", "T", "H", "K", "V", "fla_kernels_fwdbwd_us_by_name")})
            + f"  (FLA {t1 - t0:.0f} s, ours {time.time() - t1:.0f} s, total {time.time() - t_start:.0f} s)")
        with open(os.path.join(args.out, "side_by_side.json"), "w") as f:
            json.dump({"environment": env, "rows": rows}, f, indent=1)

    # ---- the table --------------------------------------------------------------------------------
    def ms(x):
        return f"{x:.3f}" if isinstance(x, float) and math.isfinite(x) else "-"

    def ratio(x):
        return f"{x:.2f}x" if isinstance(x, float) and math.isfinite(x) else "-"

    lines = ["| op | shape | FLA fwd ms | ours fwd ms | FLA/ours fwd | FLA fwd+bwd ms | ours fwd+bwd ms "
             "| FLA/ours fwd+bwd | FLA kernels alone, fwd+bwd ms | FLA kernels alone/ours | max rel. diff ours vs FLA "
             + ("| max rel. err. vs f64, ours / FLA " if args.f64 else "") + "| note |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | " + ("--- | " if args.f64 else "")
             + "--- |"]
    for r in rows:
        notes = []
        if r.get("fla_guard_off"):
            notes.append("FLA #640 Hopper guard switched off")
        notes.append(r["dtype"])
        if r["K"] > 128 and r["op"] == "kda":  # (gated_delta_rule and delta_rule: the K = 256 16-bit kernels)
            notes.append("ours: TF32 family (K = 256)")
        if r.get("ours_nonfinite"):
            notes.append(f"ours: {r['ours_nonfinite']} non-finite values")
        if "fla_kernels_error" in r:
            notes.append("FLA kernels alone: " + r["fla_kernels_error"][:60])
        if "fla_error" in r:
            notes.append("FLA failed: " + r["fla_error"][:80])
        if "ours_error" in r:
            notes.append("ours failed")
        f64_cell = ""
        if args.f64:
            if "f64_skipped" in r:
                f64_cell = "| skipped "
                notes.append("f64 reference skipped: " + r["f64_skipped"])
            elif "f64_error" in r:
                f64_cell = "| failed "
                notes.append("f64 reference failed: " + r["f64_error"][:80])
            else:
                f64_cell = f"| {worst(r.get('err_f64_ours'))} / {worst(r.get('err_f64_fla'))} "
        lines.append(f"| {r['op']} | {r['shape']} | {ms(r.get('fla_fwd_ms'))} | {ms(r.get('ours_fwd_ms'))} "
                     f"| {ratio(r.get('ratio_fwd'))} | {ms(r.get('fla_fwdbwd_ms'))} | {ms(r.get('ours_fwdbwd_ms'))} "
                     f"| {ratio(r.get('ratio_fwdbwd'))} | {ms(r.get('fla_kernels_fwdbwd_ms'))} "
                     f"| {ratio(r.get('ratio_kernels_fwdbwd'))} | {worst(r.get('rel_diff_vs_fla'))} {f64_cell}"
                     f"| {'; '.join(notes)} |")
        if "fla_safe_gate_fwd_ms" in r:
            fs, fb = r["fla_safe_gate_fwd_ms"], r["fla_safe_gate_fwdbwd_ms"]
            rf = fs / r["ours_fwd_ms"] if r.get("ours_fwd_ms") else float("nan")
            rb = fb / r["ours_fwdbwd_ms"] if r.get("ours_fwdbwd_ms") else float("nan")
            lines.append(f"| kda, FLA safe_gate=True lower_bound=-5 | {r['shape']} | {ms(fs)} | {ms(r.get('ours_fwd_ms'))} "
                         f"| {ratio(rf)} | {ms(fb)} | {ms(r.get('ours_fwdbwd_ms'))} | {ratio(rb)} | - | - | - "
                         + ("| - " if args.f64 else "") + "| FLA's bounded-gate mode (inputs satisfy g >= -5) |")
    table = "\n".join(lines)
    head = (f"{env['device']}, driver {env['driver']}, torch {env['torch']} (CUDA {env['torch_cuda']}), "
            f"Triton {env['triton']}, FLA {env['fla']} {env['fla_source']}, {env['date_utc']} UTC\n"
            f"FLA: triton.testing.do_bench median (warm-up {args.warmup:g} ms, {args.rep:g} ms of calls, L2 flushed); "
            f"ours: CUDA events median, L2 flushed; both with the L2 norm of q, k in the timed call; "
            f"FLA kernels alone: the summed durations of FLA's GPU work in a call (torch.profiler, L2 flushed), "
            f"without the gaps where the GPU waits for the host: a lower bound of FLA's time\n"
            + ("max rel. err. vs f64: the largest over o, dq, dk, dv, dbeta, dg (and hT, dh0 with h0 and dht: AS, "
               "AS2) of ||x - ref|| / ||ref||, ref the op's token-by-token recurrence in float64 (autograd) on the "
               "same 16-bit inputs, upcast; ours / FLA\n"
               if args.f64 else ""))
    with open(os.path.join(args.out, "side_by_side.md"), "w") as f:
        f.write(head + "\n" + table + "\n")
    with open(os.path.join(args.out, "side_by_side.json"), "w") as f:
        json.dump({"environment": env, "rows": rows}, f, indent=1)
    log("\n" + head)
    log(table)


if __name__ == "__main__":
    main()
