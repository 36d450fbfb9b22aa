"""amp <-> PyTorch through safetensors, with the demo's MLP and CNN (run by run.sh in a venv with safetensors).

1. amp trains, exports; PyTorch loads the file into the equivalent torch.nn.Sequential with load_state_dict and
   predicts the test set: the same classes as amp's own predictions.
2. PyTorch initialises, saves; amp imports and takes one step: its first loss equals PyTorch's on the same batch.
"""
import csv
import gzip
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file, save_file

binary, data = sys.argv[1], sys.argv[2]
if not os.path.isdir(data):
    print(f"[amp-skip] Fashion-MNIST not found at {data} (apt-get install dataset-fashion-mnist)")
    sys.exit(0)
torch.set_num_threads(2)


def idx(name):
    with gzip.open(os.path.join(data, name + ".gz")) as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def normalised(pixels, mean, std):  # as amp's loader computes it, in fp32
    a, c = np.float32(1.0 / (255.0 * np.float32(std))), np.float32(-np.float32(mean) / np.float32(std))
    return torch.from_numpy(pixels.astype(np.float32) * a + c)


def torch_model(kind):
    nn = torch.nn
    if kind == "mlp":
        return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


def inputs(kind, pixels, mean, std):
    x = normalised(pixels, mean, std)
    return x.reshape(-1, 784) if kind == "mlp" else x.reshape(-1, 1, 28, 28)


def amp_run(tmp, kind, *args):
    summary = os.path.join(tmp, "run.json")
    subprocess.run([binary, "--data", data, "--device", "cpu", "--model", kind, "--opt-level", "O0", "--json", summary,
                    *args], check=True, stdout=subprocess.DEVNULL)
    with open(summary) as f:
        return json.load(f)


test_x, test_y = idx("t10k-images-idx3-ubyte"), idx("t10k-labels-idx1-ubyte")
train_x, train_y = idx("train-images-idx3-ubyte"), idx("train-labels-idx1-ubyte")
with tempfile.TemporaryDirectory() as tmp:
    for kind in ("mlp", "cnn"):
        # 1. amp -> PyTorch: the same predictions on the 10000 test images.
        weights, predictions = os.path.join(tmp, "amp.safetensors"), os.path.join(tmp, "pred.csv")
        s = amp_run(tmp, kind, "--epochs", "1", "--train-subset", "2000", "--export", weights,
                    "--predictions", predictions)["settings"]
        model = torch_model(kind)
        model.load_state_dict(load_file(weights))  # strict: every name and shape must match
        model.eval()
        with torch.no_grad():
            torch_pred = model(inputs(kind, test_x, s["input_mean"], s["input_std"])).argmax(1).numpy()
        with open(predictions) as f:
            amp_pred = np.array([int(row["O0"]) for row in csv.DictReader(f)])
        differ = int((amp_pred != torch_pred).sum())
        agree_acc = (torch_pred == test_y).mean()
        print(f"{kind}: amp -> PyTorch: {differ} of {len(amp_pred)} test predictions differ; "
              f"PyTorch accuracy with amp's weights {agree_acc:.4f}")
        assert len(amp_pred) == 10000 and differ <= 2, differ  # fp32 near-ties at most

        # 2. PyTorch -> amp: the first step's loss on the same batch (the first 256 images, one batch).
        torch.manual_seed(5)
        model = torch_model(kind)
        start = os.path.join(tmp, "torch.safetensors")
        save_file(model.state_dict(), start)
        steps = os.path.join(tmp, "steps.csv")
        s = amp_run(tmp, kind, "--epochs", "1", "--train-subset", "256", "--batch-size", "256", "--import", start,
                    "--csv", steps)["settings"]
        with open(steps) as f:
            amp_loss = float(next(csv.DictReader(f))["loss"])
        model.train()
        with torch.no_grad():
            logits = model(inputs(kind, train_x[:256], s["input_mean"], s["input_std"]))
            torch_loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(train_y[:256].astype(np.int64)))
        rel = abs(amp_loss - torch_loss.item()) / torch_loss.item()
        print(f"{kind}: PyTorch -> amp: first-step loss amp {amp_loss:.7f}, PyTorch {torch_loss.item():.7f}, "
              f"relative difference {rel:.1e}")
        assert rel < 2e-6, rel
print("interop check passed")
