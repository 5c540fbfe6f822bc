"""Loads the GPT trainer's final state in Python's torch, converted two ways, and checks that an
ordinary (unsharded) torch.nn.Module with it computes the logits the C++ trainer computed on 2
tensor-parallel ranks:
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


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x):
        B, T, C = x.shape
        h = self.ln1(x)
        split = lambda t: t.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        att = split(self.q(h)) @ split(self.k(h)).transpose(-2, -1) / math.sqrt(C // HEADS)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + self.proj((att @ split(self.v(h))).transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, context, width, layers):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()  # head tied to the token embedding


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
    layers = len({k.split(".")[2] for k in shapes if k.startswith("model.blocks.")})
    vocab, width = shapes["model.wte.weight"]
    context = shapes["model.wpe.weight"][0]
    return GPT(vocab, context, width, layers)


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
