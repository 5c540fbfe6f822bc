"""torch's DCP, whichever torch this is: 1.13's prototype (torch.distributed._shard.checkpoint,
importable on Python 3.11 with a patch) or 2.x's torch.distributed.checkpoint.

Shared by tests/system/interop/interop.py and tests/system/fuzz/make_corpus.py.
"""
import pickle

try:
    import torch
except ImportError:  # the callers say so themselves
    torch = None

#: True for torch 2.x, whose DCP lives in torch.distributed.checkpoint and whose .metadata names
#: those module paths (cairn's dcp::flavor::torch2); False for torch 1.13 (flavor::torch1_13).
TORCH2 = torch is not None and int(torch.__version__.split(".")[0]) >= 2


def import_dcp():
    """The DCP module. On torch 1.13 under Python 3.11 its TensorProperties dataclass must be
    hashable, which torch 1.13 does not declare: the import runs with dataclass patched to add
    unsafe_hash."""
    if TORCH2:
        import torch.distributed.checkpoint as dcp
        return dcp
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


def load(dcp, sd, reader):
    """Loads `sd` in place from `reader` in this one process (no process group)."""
    if TORCH2:
        dcp.load(sd, storage_reader=reader)
    else:
        dcp.load_state_dict(sd, reader, no_dist=True)


def save(dcp, sd, writer):
    """Saves `sd` with `writer` from this one process (no process group)."""
    if TORCH2:
        dcp.save(sd, storage_writer=writer)
    else:
        dcp.save_state_dict(sd, writer, no_dist=True)


class MappingUnpickler(pickle.Unpickler):
    """Loads a .metadata naming torch 2.x module paths into torch 1.13 (FORMATS.md section 6)."""

    def find_class(self, module, name):
        if module.startswith("torch.distributed.checkpoint"):
            module = module.replace("torch.distributed.checkpoint",
                                    "torch.distributed._shard.checkpoint")
        return super().find_class(module, name)


def reader(dcp, path):
    """A FileSystemReader of `path` that torch 1.13 can also use for flavor-torch2 files."""
    if TORCH2:
        return dcp.FileSystemReader(path)
    import os

    class Reader(dcp.FileSystemReader):
        def read_metadata(self):
            with open(os.path.join(path, ".metadata"), "rb") as f:
                return MappingUnpickler(f).load()

    return Reader(path)
