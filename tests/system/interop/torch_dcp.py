"""torch 1.13's DCP prototype (torch.distributed._shard.checkpoint), importable on Python 3.11.

Shared by tests/system/interop/interop.py and tests/system/fuzz/make_corpus.py.
"""


def import_dcp():
    """The DCP module. On Python 3.11 its TensorProperties dataclass must be hashable, which
    torch 1.13 does not declare: the import runs with dataclass patched to add unsafe_hash."""
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
