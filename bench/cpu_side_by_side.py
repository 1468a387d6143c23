#!/usr/bin/env python3
"""CPU side by side: deltagrad against PyTorch (eager and torch.compile) training the default MQAR
model, the same threads on both sides, runs alternated in one invocation.

    python3 bench/cpu_side_by_side.py [--threads 2] [--steps 40] [--skip 10] [--rounds 2]
                                      [--deltagrad build/release/deltagrad] [--sides deltagrad,eager,compile]

Each run is its own process (so that its peak RSS is its own; OMP_NUM_THREADS and
OMP_WAIT_POLICY=passive for every side): `deltagrad train` for --steps steps
(tokens/s from the elapsed_s column of its metrics.csv, after the first --skip steps), and this file
with --worker eager|compile, which trains the PyTorch model below for the same steps.  The rounds
alternate the sides (A B C A B C ...); the table gives the median tokens/s over the rounds, and the
largest peak RSS (ru_maxrss of the child).

The PyTorch model is the default `deltagrad train` model written with torch's own ops: embedding,
2 blocks of [RMSNorm, Gated DeltaNet (q/k/v projections, causal depthwise convolutions of width 4
with SiLU, beta = sigmoid(b_proj x), gate g = -exp(A_log) softplus(a_proj x + dt_bias), the chunked
gated delta rule with chunk 64 and L2-normalised q, k, gated RMSNorm, o_proj), residual, RMSNorm,
SwiGLU MLP, residual], final RMSNorm, LM head and cross-entropy over the scored rows only (as
deltagrad does: the last block's output projection, MLP, final norm and head run at the rows that
carry a target).  Autograd runs through the chunked algorithm; (I + A)^-1 by a triangular solve.
AdamW (lr 1e-3, betas 0.9/0.95, weight decay 0.1 off the gates and norms) and global-norm clipping
at 1.0, as deltagrad's default run.  The batch: 64 sequences of 128 tokens from a vocabulary of
256, 16 queries scored per sequence (the MQAR default)."""
import argparse
import csv
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

B, T, VOCAB, D, LAYERS, HEADS, HEAD_DIM, MLP, CONV, CHUNK, QUERIES = 64, 128, 256, 128, 2, 1, 128, 256, 4, 64, 16
EPS = 1e-6


def torch_worker(mode, steps, skip, threads):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(1)

    def rms_norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w

    def l2norm(x):
        return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + EPS)

    def chunk_gated_delta_rule(q, k, v, g, beta):
        """q, k [B,T,H,K], v [B,T,H,V], g (log decay) and beta [B,T,H]; returns o [B,T,H,V].
        Per chunk of C rows: G = chunk-local cumsum of g, A = strict_lower(beta K K^T o e^{G_i - G_j}),
        T = (I + A)^-1, W = T (beta e^G o K), U = T (beta V); then across chunks, with the state S,
        V' = U - W S,  O = (e^G o Q) S + lower(Q K^T o e^{G_i - G_j}) V',
        S <- e^{G_last} S + (e^{G_last - G} o K)^T V'."""
        b, t, h, kd = q.shape
        vd, nc = v.shape[-1], t // CHUNK
        q = l2norm(q) * kd**-0.5
        k = l2norm(k)
        q, k, v = (x.transpose(1, 2).reshape(b, h, nc, CHUNK, -1) for x in (q, k, v))
        g, beta = (x.transpose(1, 2).reshape(b, h, nc, CHUNK) for x in (g, beta))
        g = g.cumsum(-1)
        lower = torch.ones(CHUNK, CHUNK, dtype=torch.bool).tril()
        strict = lower.tril(-1)
        gamma = (g[..., :, None] - g[..., None, :]).masked_fill(~lower, -math.inf).exp()
        kb = k * beta[..., None]
        eye = torch.eye(CHUNK)
        A = (kb @ k.transpose(-1, -2) * gamma).masked_fill(~strict, 0)
        Tinv = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False)
        W = Tinv @ (kb * g.exp()[..., None])
        U = Tinv @ (v * beta[..., None])
        S = q.new_zeros(b, h, kd, vd)
        outs = []
        for i in range(nc):
            qi, ki, gi = q[:, :, i], k[:, :, i], g[:, :, i]
            vnew = U[:, :, i] - W[:, :, i] @ S
            outs.append((qi * gi.exp()[..., None]) @ S + (qi @ ki.transpose(-1, -2) * gamma[:, :, i]) @ vnew)
            glast = gi[..., -1:]
            S = S * glast.exp()[..., None] + (ki * (glast - gi).exp()[..., None]).transpose(-1, -2) @ vnew
        return torch.stack(outs, 2).reshape(b, h, t, vd).transpose(1, 2)

    class GatedDeltaNet(nn.Module):
        def __init__(self):
            super().__init__()
            kd, vd = HEADS * HEAD_DIM, HEADS * HEAD_DIM
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(D, n, bias=False) for n in (kd, kd, vd))
            self.a_proj, self.b_proj = nn.Linear(D, HEADS, bias=False), nn.Linear(D, HEADS, bias=False)
            self.convs = nn.ModuleList(nn.Conv1d(n, n, CONV, groups=n, padding=CONV - 1, bias=False) for n in (kd, kd, vd))
            self.A_log = nn.Parameter(torch.empty(HEADS).uniform_(0, 16).clamp_min(1e-4).log())
            dt = torch.exp(torch.rand(HEADS) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
            self.g_proj = nn.Linear(D, vd, bias=False)
            self.o_norm = nn.Parameter(torch.ones(HEAD_DIM))
            self.o_proj = nn.Linear(vd, D, bias=False)

        def forward(self, x, rows):
            b, t, _ = x.shape
            q, k, v = (F.silu(conv(p(x).transpose(1, 2))[..., :t]).transpose(1, 2)
                       for p, conv in zip((self.q_proj, self.k_proj, self.v_proj), self.convs))
            beta = torch.sigmoid(self.b_proj(x))
            g = -self.A_log.exp() * F.softplus(self.a_proj(x) + self.dt_bias)
            o = chunk_gated_delta_rule(q.view(b, t, HEADS, -1), k.view(b, t, HEADS, -1), v.view(b, t, HEADS, -1), g, beta)
            o = o.reshape(b * t, HEADS, -1)
            xr = x.reshape(b * t, -1)
            if rows is not None:
                o, xr = o[rows], xr[rows]
            z = self.g_proj(xr).view(o.shape)
            o = rms_norm(o, self.o_norm) * F.silu(z)
            return self.o_proj(o.reshape(o.shape[0], -1))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm, self.mlp_norm = nn.Parameter(torch.ones(D)), nn.Parameter(torch.ones(D))
            self.attn = GatedDeltaNet()
            self.gate_proj, self.up_proj = nn.Linear(D, MLP, bias=False), nn.Linear(D, MLP, bias=False)
            self.down_proj = nn.Linear(MLP, D, bias=False)

        def forward(self, h, rows):
            m = self.attn(rms_norm(h, self.attn_norm), rows)
            h = (h.reshape(-1, D)[rows] if rows is not None else h.reshape(-1, D)) + m
            x = rms_norm(h, self.mlp_norm)
            return h + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings = nn.Embedding(VOCAB, D)
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
            self.norm = nn.Parameter(torch.ones(D))
            self.lm_head = nn.Linear(D, VOCAB, bias=False)
            for n, p in self.named_parameters():
                if p.ndim >= 2:
                    nn.init.normal_(p, std=0.02)

        def forward(self, ids, rows, targets):
            h = self.embeddings(ids)
            for i, blk in enumerate(self.blocks):
                last = i == len(self.blocks) - 1
                h = blk(h, rows if last else None)
                if not last:
                    h = h.view(ids.shape[0], ids.shape[1], D)
            return F.cross_entropy(self.lm_head(rms_norm(h, self.norm)), targets)

    model = LM()
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    loss_fn = torch.compile(model) if mode == "compile" else model

    def batch():
        ids = torch.randint(0, VOCAB, (B, T))
        pos = torch.stack([torch.randperm(T // 2)[:QUERIES] + T // 2 for _ in range(B)])
        rows = (pos + torch.arange(B)[:, None] * T).reshape(-1).sort().values
        return ids, rows, torch.randint(VOCAB // 2, VOCAB, (rows.numel(),))

    t0 = None
    for step in range(steps):
        if step == skip:
            t0 = time.perf_counter()
        ids, rows, targets = batch()
        loss = loss_fn(ids, rows, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    elapsed = time.perf_counter() - t0
    print(json.dumps({"tok_s": (steps - skip) * B * T / elapsed, "loss": loss.item(), "torch": torch.__version__}))


def peak_rss_mb(cmd, env):
    """Runs cmd; returns its stdout and its peak RSS in MB (os.wait4: the child's own ru_maxrss)."""
    with tempfile.TemporaryFile("w+") as errf:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, env=env, text=True)
        out = p.stdout.read()
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            errf.seek(0)
            sys.exit("%s failed (%d):\n%s" % (" ".join(cmd), p.returncode, errf.read()[-3000:]))
    return out, ru.ru_maxrss / 1024.0


def run_deltagrad(exe, steps, skip, threads, env):
    with tempfile.TemporaryDirectory() as d:
        cmd = [exe, "train", "--steps", str(steps), "--threads", str(threads), "--eval-every", "0",
               "--save-every", "0", "--target-acc", "0", "--quiet", "--out", d + "/run"]
        _, rss = peak_rss_mb(cmd, env)
        with open(d + "/run/metrics.csv") as f:
            rows = {int(r["step"]): float(r["elapsed_s"]) for r in csv.DictReader(f)}
    return (steps - skip) * B * T / (rows[steps] - rows[skip]), rss


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the rate")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--deltagrad", default="build/release/deltagrad")
    ap.add_argument("--sides", default="deltagrad,eager,compile")
    ap.add_argument("--worker", choices=("eager", "compile"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        torch_worker(a.worker, a.steps, a.skip, a.threads)
        return
    # deltagrad train sets OMP_WAIT_POLICY=passive for itself (tools/cmd_train.c); PyTorch gets the
    # same, which spares it the active waiting that costs most on a shared machine
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OMP_WAIT_POLICY="passive")
    sides = a.sides.split(",")
    rate, rss, torch_version = {s: [] for s in sides}, {s: 0.0 for s in sides}, None
    load0 = os.getloadavg()
    for r in range(a.rounds):
        for s in sides:
            if s == "deltagrad":
                tok_s, mb = run_deltagrad(a.deltagrad, a.steps, a.skip, a.threads, env)
            else:
                out, mb = peak_rss_mb([sys.executable, __file__, "--worker", s, "--steps", str(a.steps), "--skip",
                                       str(a.skip), "--threads", str(a.threads)], env)
                res = json.loads(out.strip().splitlines()[-1])
                tok_s, torch_version = res["tok_s"], res["torch"]
            rate[s].append(tok_s)
            rss[s] = max(rss[s], mb)
            print("round %d %-9s %8.0f tok/s  peak RSS %6.1f MB" % (r + 1, s, tok_s, mb), file=sys.stderr, flush=True)
    load1 = os.getloadavg()
    names = {"deltagrad": "deltagrad", "eager": "PyTorch eager", "compile": "PyTorch torch.compile"}
    print("%d threads each side, %d steps per run (rate over the last %d), %d rounds alternated; torch %s; "
          "load average %.2f before, %.2f after\n" % (a.threads, a.steps, a.steps - a.skip, a.rounds,
                                                      torch_version or "-", load0[0], load1[0]))
    print("| side | tokens/s (median) | runs | peak RSS MB | deltagrad's speed-up |")
    print("| --- | --- | --- | --- | --- |")
    med = {s: statistics.median(rate[s]) for s in sides}
    for s in sides:
        up = "%.2fx" % (med["deltagrad"] / med[s]) if "deltagrad" in med and s != "deltagrad" else "-"
        print("| %s | %.0f | %s | %.0f | %s |" % (names[s], med[s], " ".join("%.0f" % x for x in rate[s]), rss[s], up))


if __name__ == "__main__":
    main()
