"""The demo's recipes in PyTorch (MLP 784-256-128-10, or the CNN conv3x3-32-BN-ReLU-maxpool, conv3x3-64-BN-ReLU-
maxpool, 3136-128-10; cross-entropy, SGD lr 0.05 momentum 0.9, batch 128): median epoch seconds and test accuracy
per mode, one JSON line each.

usage: pytorch_fashion_mnist.py DATA_DIR EPOCHS [cpu|cuda] [mlp|cnn] [SEED (1)] [MODES (all, or e.g. fp32)]
                                [constant|cosine (constant)]
  cosine: the learning rate anneals per step from 0.05 to 0 over the run, as fashion_mnist --schedule cosine
  cpu:  fp32 and bf16 autocast
  cuda: fp32, fp16 autocast with GradScaler (PyTorch's AMP) and bf16 autocast"""
import contextlib
import gzip
import json
import math
import statistics
import sys
import time

import numpy as np
import torch
from torch import nn


def idx(path):
    with gzip.open(path) as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def make_model(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


def main(data_dir, epochs, device, kind, seed=1, only="all", schedule="constant"):
    load = lambda name: idx(f"{data_dir}/{name}.gz")
    shape = (-1, 784) if kind == "mlp" else (-1, 1, 28, 28)
    norm = lambda x: torch.from_numpy(((x.reshape(shape) / 255.0 - 0.2860) / 0.3530).astype(np.float32))
    xtr, ytr = norm(load("train-images-idx3-ubyte")), torch.from_numpy(load("train-labels-idx1-ubyte").astype(np.int64))
    xte, yte = norm(load("t10k-images-idx3-ubyte")), torch.from_numpy(load("t10k-labels-idx1-ubyte").astype(np.int64))
    xtr, ytr, xte, yte = (t.to(device) for t in (xtr, ytr, xte, yte))
    modes = {"fp32": None, "bf16-autocast": torch.bfloat16}
    if device == "cuda":
        modes = {"fp32": None, "fp16-amp": torch.float16, "bf16-autocast": torch.bfloat16}
    if only != "all":
        modes = {m: modes[m] for m in only.split(",")}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for mode, dtype in modes.items():
        torch.manual_seed(seed)
        model = make_model(kind).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        steps = epochs * ((len(xtr) + 127) // 128)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, (lambda k: 0.5 * (1 + math.cos(math.pi * k / steps))) if schedule == "cosine" else (lambda k: 1.0))
        fp16 = dtype == torch.float16
        scaler = torch.amp.GradScaler(device, enabled=fp16) if hasattr(torch.amp, "GradScaler") \
            else torch.cuda.amp.GradScaler(enabled=fp16)
        autocast = (lambda: torch.autocast(device, dtype=dtype)) if dtype else contextlib.nullcontext
        loss_fn = nn.CrossEntropyLoss()
        times = []
        for _ in range(epochs):
            sync()
            start = time.perf_counter()
            perm = torch.randperm(len(xtr), device=device)
            for i in range(0, len(xtr), 128):
                idxs = perm[i:i + 128]
                with autocast():
                    loss = loss_fn(model(xtr[idxs]), ytr[idxs])
                opt.zero_grad()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                sched.step()
            sync()
            times.append(time.perf_counter() - start)
        model.eval()
        with torch.no_grad(), autocast():
            acc = sum((model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum().item()
                      for i in range(0, len(xte), 1000)) / len(xte)
        print(json.dumps({"mode": mode, "device": device, "model": kind, "seed": seed, "schedule": schedule,
                          "epoch_seconds": statistics.median(times),
                          "step_ms": 1e3 * statistics.median(times) / ((len(xtr) + 127) // 128),
                          "test_accuracy": acc, "train_images": len(xtr)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "cpu",
         sys.argv[4] if len(sys.argv) > 4 else "mlp", int(sys.argv[5]) if len(sys.argv) > 5 else 1,
         sys.argv[6] if len(sys.argv) > 6 else "all", sys.argv[7] if len(sys.argv) > 7 else "constant")
