"""amp's GPT2 against transformers' GPT2LMHeadModel on the same weights (run by run.sh in a venv with PyPI's
transformers and safetensors beside Debian's python3-torch).

transformers initialises a GPT2LMHeadModel (2 blocks, width 64, 4 heads; the biases and LayerNorms perturbed so
that none is trivial) and saves it with save_pretrained; gpt2_tool imports it at O0 and O2-bf16 and writes its
logits on a batch, the losses of ten AdamW steps and its export. Checked: the logits (O0 within 1e-4, O2-bf16
within bf16's tolerance), the losses against ten torch.optim.AdamW steps (O0 within 1e-4 relative), and that the
export loads back into GPT2LMHeadModel with strict loading and gives amp's logits after training.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel

tool = sys.argv[1]
torch.set_num_threads(2)
torch.manual_seed(0)
V, POS, LAYERS, HEADS, WIDTH, BATCH, T, STEPS = 97, 32, 2, 4, 64, 4, 24, 10
config = GPT2Config(vocab_size=V, n_positions=POS, n_layer=LAYERS, n_head=HEADS, n_embd=WIDTH, resid_pdrop=0.0,
                    embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new", layer_norm_epsilon=1e-5)
reference = GPT2LMHeadModel(config)
with torch.no_grad():
    for name, p in reference.named_parameters():
        if p.dim() == 1:
            p.add_(0.1 * torch.randn_like(p))
ids = torch.randint(0, V, (BATCH, T + 1))
x, y = ids[:, :T], ids[:, 1:]


def logits_of(model):
    model.eval()
    with torch.no_grad():
        return model(x).logits.double().numpy()


def torch_losses(model):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    model.train()
    losses = []
    for _ in range(STEPS):
        loss = torch.nn.functional.cross_entropy(model(x).logits.reshape(-1, V), y.reshape(-1))
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return np.array(losses)


def read_logits(path):
    return np.fromfile(path, dtype=np.float32).astype(np.float64).reshape(BATCH, T, V)


with tempfile.TemporaryDirectory() as tmp:
    reference.save_pretrained(os.path.join(tmp, "hf"), safe_serialization=True)
    weights = os.path.join(tmp, "hf", "model.safetensors")
    assert "lm_head.weight" not in load_file(weights), "transformers saved the tied head; amp accepts it, but the " \
                                                      "test expects the usual file"
    ids.numpy().astype(np.int32).tofile(os.path.join(tmp, "ids.bin"))
    want_before = logits_of(reference)
    want_losses = torch_losses(reference)
    # bf16's tolerance: 4 units of its rounding (2^-8) at the largest logit.
    def tolerance(level, logits):
        return 1e-4 if level == "O0" else 4 * 2.0 ** -8 * np.abs(logits).max()

    for level, loss_tol in (("O0", 1e-4), ("O2-bf16", 1e-2)):
        out = os.path.join(tmp, level)
        os.mkdir(out)
        r = subprocess.run([tool, level, weights, os.path.join(tmp, "ids.bin"), *map(str, (
            V, POS, LAYERS, HEADS, WIDTH, BATCH, T, STEPS)), out], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        got = read_logits(os.path.join(out, "logits_before.bin"))
        err, logits_tol = np.abs(got - want_before).max(), tolerance(level, want_before)
        losses = np.loadtxt(os.path.join(out, "losses.txt"))
        loss_err = np.abs(losses / want_losses - 1).max()
        # The export into a fresh GPT2LMHeadModel, every key present (strict), amp's trained logits out.
        back = GPT2LMHeadModel(config)
        back.load_state_dict(load_file(os.path.join(out, "export.safetensors")), strict=True)
        after = read_logits(os.path.join(out, "logits_after.bin"))
        back_err, back_tol = np.abs(logits_of(back) - after).max(), tolerance(level, after)
        print(f"{level}: logits max |amp - transformers| {err:.3g} (tolerance {logits_tol:.3g}), "
              f"losses max relative {loss_err:.3g} (tolerance {loss_tol:.3g}), export -> transformers logits "
              f"{back_err:.3g} (tolerance {back_tol:.3g}); losses amp {losses[0]:.6f} .. {losses[-1]:.6f}, torch {want_losses[0]:.6f} .. "
              f"{want_losses[-1]:.6f}")
        assert err <= logits_tol, (level, err)
        assert loss_err <= loss_tol, (level, loss_err, losses, want_losses)
        assert back_err <= back_tol, (level, back_err)
print("gpt2 interop check passed")
