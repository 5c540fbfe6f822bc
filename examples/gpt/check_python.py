"""Loads the reference trainer's final state (a Llama-architecture model) in Python's torch,
converted two ways, and checks that an ordinary (unsharded) torch.nn.Module with it computes the
logits the C++ trainer computed on 2 tensor-parallel ranks:
  WORK_DIR/safetensors  `cairn convert --format one_file` (safetensors), read here by hand
  WORK_DIR/torch_dist   `cairn convert --format torch_dist`, read by torch's DCP
usage: python3 check_python.py WORK_DIR"""
import glob
import json
import math
import os
import pickle
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HEADS = 4


class RMSNorm(nn.Module):
    def __init__(self, width, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotary(T, d, theta=10000.0):
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    freqs = torch.outer(torch.arange(T).float(), inv_freq)
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos(), emb.sin()


def apply_rotary(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


class Attention(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(width, width, bias=False) for _ in range(4))

    def forward(self, x):
        B, T, C = x.shape
        d = C // HEADS
        split = lambda t: t.view(B, T, HEADS, d).transpose(1, 2)
        cos, sin = rotary(T, d)
        q, k = apply_rotary(split(self.q_proj(x)), cos, sin), apply_rotary(split(self.k_proj(x)), cos, sin)
        att = q @ k.transpose(-2, -1) / math.sqrt(d)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        return self.o_proj((att @ split(self.v_proj(x))).transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(width, hidden, bias=False)
        self.up_proj = nn.Linear(width, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.input_layernorm = RMSNorm(width)
        self.self_attn = Attention(width)
        self.post_attention_layernorm = RMSNorm(width)
        self.mlp = MLP(width, hidden)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """LlamaForCausalLM's inner model and tied head, in plain torch (torch 1.13 has no
    transformers here; the today tier checks transformers itself: hf_check.py)."""

    def __init__(self, vocab, width, hidden, layers):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Layer(width, hidden) for _ in range(layers))
        self.norm = RMSNorm(width)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x) @ self.embed_tokens.weight.t()  # head tied to the token embedding


DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "F16": torch.float16,
          "BF16": torch.bfloat16, "I32": torch.int32, "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors(path):
    """Every tensor of a safetensors file: 8-byte header length, JSON header, data."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        out[key] = torch.frombuffer(raw, dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def model_for(shapes):
    layers = len({k.split(".")[2] for k in shapes if k.startswith("model.layers.")})
    vocab, width = shapes["model.embed_tokens.weight"]
    hidden = shapes["model.layers.0.mlp.gate_proj.weight"][0]
    return Llama(vocab, width, hidden, layers)


def import_dcp():
    """torch 1.13's DCP prototype; its TensorProperties dataclass must be hashable on 3.11."""
    import dataclasses
    orig = dataclasses.dataclass

    def patched(cls=None, /, **kw):
        def wrap(c):
            if c.__name__ == "TensorProperties":
                kw["unsafe_hash"] = True
            return orig(**kw)(c)
        return wrap if cls is None else wrap(cls)

    dataclasses.dataclass = patched
    try:
        import torch.distributed._shard.checkpoint as dcp
    finally:
        dataclasses.dataclass = orig
    return dcp


class MappingUnpickler(pickle.Unpickler):
    """cairn writes torch 2's module paths (torch.distributed.checkpoint); 1.13 has them under
    torch.distributed._shard.checkpoint."""

    def find_class(self, module, name):
        if module.startswith("torch.distributed.checkpoint"):
            module = module.replace("torch.distributed.checkpoint", "torch.distributed._shard.checkpoint")
        return super().find_class(module, name)


def check(label, model, tokens, want):
    with torch.no_grad():
        got = model(tokens)
    diff = (got - want).abs().max().item()
    ok = torch.allclose(got, want, rtol=1e-4, atol=1e-5)
    print(f"{label}: logits of {tuple(got.shape)} vs the C++ trainer's (tp 2): "
          f"max |difference| {diff:.3g} -> {'equal' if ok else 'DIFFERENT'}")
    return ok


def main():
    work = sys.argv[1]
    files = glob.glob(os.path.join(work, "safetensors", "*.safetensors"))
    assert files, "no safetensors file in " + work
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(f))
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    tokens = torch.frombuffer(bytearray(open(os.path.join(work, "eval_tokens.bin"), "rb").read()),
                              dtype=torch.int64).reshape(3, -1)
    model = model_for(shapes)
    want = torch.frombuffer(bytearray(open(os.path.join(work, "logits_resume_2x2.bin"), "rb").read()),
                            dtype=torch.float32).reshape(3, tokens.shape[1], -1)

    state = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    model.load_state_dict(state, strict=True)
    ok = check(f"safetensors ({len(files)} file, {len(tensors)} tensors)", model, tokens, want)

    dcp = import_dcp()
    dist = os.path.join(work, "torch_dist")

    class Reader(dcp.FileSystemReader):
        def read_metadata(self):
            with open(os.path.join(dist, ".metadata"), "rb") as f:
                return MappingUnpickler(f).load()

    fresh = model_for(shapes)
    sd = {"model." + k: torch.zeros_like(v) for k, v in fresh.state_dict().items()}
    dcp.load_state_dict(sd, Reader(dist), no_dist=True)
    fresh.load_state_dict({k[len("model."):]: v for k, v in sd.items()}, strict=True)
    ok = check(f"torch_dist via torch {torch.__version__} DCP load_state_dict", fresh, tokens, want) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
