"""The demo's recipe in PyTorch on the CPU (MLP 784-256-128-10, ReLU, cross-entropy,
SGD lr 0.05 momentum 0.9, batch 128): median epoch seconds and test accuracy, in fp32
and under bf16 autocast. Prints one JSON line per mode."""
import gzip
import json
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


def main(data_dir, epochs):
    load = lambda name: idx(f"{data_dir}/{name}.gz")
    norm = lambda x: torch.from_numpy(((x.reshape(len(x), -1) / 255.0 - 0.2860) / 0.3530).astype(np.float32))
    xtr, ytr = norm(load("train-images-idx3-ubyte")), torch.from_numpy(load("train-labels-idx1-ubyte").astype(np.int64))
    xte, yte = norm(load("t10k-images-idx3-ubyte")), torch.from_numpy(load("t10k-labels-idx1-ubyte").astype(np.int64))
    for mode in ("fp32", "bf16-autocast"):
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        times = []
        for _ in range(epochs):
            start = time.perf_counter()
            perm = torch.randperm(len(xtr))
            for i in range(0, len(xtr), 128):
                idxs = perm[i:i + 128]
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode != "fp32"):
                    loss = loss_fn(model(xtr[idxs]), ytr[idxs])
                opt.zero_grad()
                loss.backward()
                opt.step()
            times.append(time.perf_counter() - start)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode != "fp32"):
            acc = (model(xte).argmax(1) == yte).float().mean().item()
        print(json.dumps({"mode": mode, "epoch_seconds": statistics.median(times), "test_accuracy": acc}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
