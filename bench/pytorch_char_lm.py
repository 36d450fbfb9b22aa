"""char_lm's model, data order and optimiser in PyTorch (eager), for a side-by-side speed comparison: the same
character GPT (every weight N(0, 0.02) and zero biases, as amp's gpt2 initializer; pre-LN blocks with causal attention and a GELU(tanh) MLP,
the output projection tied to the embedding), the same training windows (splitmix64 of the seed and the window
index), AdamW (betas 0.9/0.99, no decay on biases and norms), linear warm-up then cosine, clipping at 1.

usage: pytorch_char_lm.py DATA_DIR STEPS [cpu|cuda] [modes, comma-separated: fp32,bf16-autocast,fp16-amp]
prints one JSON line per mode: tokens_per_second (training steps only), val_loss (nats per character)."""
import contextlib
import json
import math
import os
import sys
import time

import numpy as np
import torch
from torch import nn

CONTEXT, LAYERS, HEADS, WIDTH, BATCH = 128, 4, 4, 128, 32
LR, MIN_LR, WARMUP, WD, CLIP, SEED, EVAL_BATCHES = 3e-3, 3e-4, 60, 0.1, 1.0, 1, 8
MASK64 = (1 << 64) - 1


def mix64(x):
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def corpus(folder):
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder)
                   if "." not in f and os.path.isfile(os.path.join(folder, f)))
    text = b"".join(open(f, "rb").read() for f in files)
    chars = sorted(set(text))
    lut = np.zeros(256, dtype=np.int64)
    lut[chars] = np.arange(len(chars))
    ids = lut[np.frombuffer(text, dtype=np.uint8)]
    split = len(text) * 9 // 10
    return torch.from_numpy(ids[:split]), torch.from_numpy(ids[split:]), len(chars)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.fc, self.fc_proj = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)
        self.register_buffer("mask", torch.tril(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool)))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, c // HEADS).permute(2, 0, 3, 1, 4)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(c // HEADS)
        p = torch.softmax(s.masked_fill(~self.mask[:t, :t], float("-inf")).float(), -1).to(v.dtype)
        x = x + self.proj((p @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.fc_proj(nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        nn.init.normal_(self.wte.weight, 0, 0.02)
        nn.init.normal_(self.wpe.weight, 0, 0.02)
        self.h = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        for module in self.h.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0, 0.02)
                nn.init.zeros_(module.bias)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe.weight[: ids.shape[1]]
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


def lr_at(step, steps):
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    step -= WARMUP
    total = max(1, steps - WARMUP)
    return MIN_LR if step >= total else MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * step / total))


def windows(text, starts):
    idx = torch.tensor(starts)[:, None] + torch.arange(CONTEXT + 1)[None, :]
    w = text[idx]
    return w[:, :-1], w[:, 1:]


def main(folder, steps, device, modes):
    train, val, vocab = corpus(folder)
    limit = len(train) - CONTEXT - 1
    vlimit = len(val) - CONTEXT - 1
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.set_num_threads(int(os.environ.get("AMP_NUM_THREADS", os.cpu_count())))
    for mode in modes:
        torch.manual_seed(SEED)
        model = Gpt(vocab).to(device)
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=LR, betas=(0.9, 0.99), eps=1e-8)
        dtype = {"fp32": None, "bf16-autocast": torch.bfloat16, "fp16-amp": torch.float16}[mode]
        autocast = (lambda: torch.autocast(device, dtype=dtype)) if dtype else contextlib.nullcontext
        scaler = torch.cuda.amp.GradScaler(enabled=dtype == torch.float16)
        seconds = 0.0
        for step in range(steps):
            starts = [mix64((SEED * 0x9E3779B97F4A7C15 + step * BATCH + r) & MASK64) % limit for r in range(BATCH)]
            x, y = (t.to(device) for t in windows(train, starts))
            for group in opt.param_groups:
                group["lr"] = lr_at(step, steps)
            sync()
            start = time.perf_counter()
            with autocast():
                loss = nn.functional.cross_entropy(model(x).float().view(-1, vocab), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            scaler.step(opt)
            scaler.update()
            sync()
            seconds += time.perf_counter() - start
        model.eval()
        total = 0.0
        with torch.no_grad(), autocast():
            for b in range(EVAL_BATCHES):
                starts = [(b * BATCH + r) * (vlimit // (EVAL_BATCHES * BATCH)) for r in range(BATCH)]
                x, y = (t.to(device) for t in windows(val, starts))
                total += nn.functional.cross_entropy(model(x).float().view(-1, vocab), y.reshape(-1)).item()
        print(json.dumps({"mode": mode, "device": device, "steps": steps, "tokens_per_second":
                          steps * BATCH * CONTEXT / seconds, "step_ms": 1e3 * seconds / steps,
                          "val_loss": total / EVAL_BATCHES}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "cpu",
         (sys.argv[4] if len(sys.argv) > 4 else "fp32,bf16-autocast").split(","))
