# Builds a torch 2.x-style DCP .metadata pickle by hand: fake modules carrying the 2.x class
# names (no torch import), pickled by CPython's own pickle (protocol 4, the DCP default).
import sys, types, pickle, pathlib, enum
from dataclasses import dataclass, field
from typing import Optional, Any

def mod(name):
    m = types.ModuleType(name); sys.modules[name] = m
    parts = name.split('.')
    for i in range(1, len(parts)):
        parent = '.'.join(parts[:i])
        if parent not in sys.modules: sys.modules[parent] = types.ModuleType(parent)
    return m

torch = mod('torch')
class Size(tuple):
    def __reduce__(self): return (Size, (tuple(self),))
Size.__module__ = 'torch'; torch.Size = Size
class dtype:
    __module__ = "torch"
    def __init__(self, n): self.n = n; self.__module__ = "torch"
    def __reduce__(self): return self.n
for n in ('float32', 'bfloat16', 'int64'):
    setattr(torch, n, dtype(n))
ser = mod('torch.serialization')
def _get_layout(name): return name
_get_layout.__module__ = 'torch.serialization'; ser._get_layout = _get_layout
class Layout:
    def __reduce__(self): return (_get_layout, ('torch.strided',))

md = mod('torch.distributed.checkpoint.metadata')
fs = mod('torch.distributed.checkpoint.filesystem')
def reg(m, cls):
    cls.__module__ = m.__name__; cls.__qualname__ = cls.__name__; setattr(m, cls.__name__, cls); return cls

class _MEM_FORMAT_ENCODING(enum.Enum):
    TORCH_CONTIGUOUS_FORMAT = 0
reg(md, _MEM_FORMAT_ENCODING)

@dataclass
class TensorProperties:
    dtype: Any; layout: Any = None; requires_grad: bool = False; pin_memory: bool = False
    def __getstate__(self):
        return (self.dtype, Layout(), self.requires_grad, _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT, self.pin_memory)
    def __setstate__(self, s): pass
reg(md, TensorProperties)
@dataclass
class ChunkStorageMetadata:
    offsets: Any; sizes: Any
reg(md, ChunkStorageMetadata)
@dataclass
class TensorStorageMetadata:
    properties: Any; size: Any; chunks: Any
reg(md, TensorStorageMetadata)
@dataclass
class BytesStorageMetadata:
    pass
reg(md, BytesStorageMetadata)
@dataclass
class StorageMeta:
    checkpoint_id: Any = None; save_id: Any = None; load_id: Any = None; modules: Any = field(default_factory=list)
reg(md, StorageMeta)
@dataclass
class Metadata:
    state_dict_metadata: Any; planner_data: Any = None; storage_data: Any = None; storage_meta: Any = None; version: Any = None
reg(md, Metadata)
@dataclass(frozen=True)
class MetadataIndex:
    fqn: str; offset: Optional[Any] = None; index: Optional[int] = field(hash=False, compare=False, default=None)
reg(md, MetadataIndex)
@dataclass
class _StorageInfo:
    relative_path: str; offset: int; length: int; transform_descriptors: Any = None
reg(fs, _StorageInfo)
# Megatron's subclass
mg = mod('megatron.core.dist_checkpointing.strategies.torch')
@dataclass
class MCoreMetadata(Metadata):
    mcore_data: Any = None
reg(mg, MCoreMetadata)

def build(cls=Metadata, **extra):
    sdm = {
        'model.w': TensorStorageMetadata(TensorProperties(torch.bfloat16), Size((4, 6)),
                                         [ChunkStorageMetadata(Size((0, 0)), Size((2, 6))),
                                          ChunkStorageMetadata(Size((2, 0)), Size((2, 6)))]),
        'step': BytesStorageMetadata(),
    }
    sd = {
        MetadataIndex('model.w', Size((0, 0)), 0): _StorageInfo('__0_0.distcp', 0, 1000),
        MetadataIndex('model.w', Size((2, 0)), 1): _StorageInfo('__1_0.distcp', 64, 1000, ['zstd']),
        MetadataIndex('step'): _StorageInfo('__0_0.distcp', 1000, 500),
    }
    sm = StorageMeta(pathlib.PosixPath('/ckpt/step10'), 'sid', None, [])
    return cls(sdm, {'model.w': ('model', 'w'), 'step': ('step',)}, sd, sm, '1.0.0', **extra)

print('plain', pickle.dumps(build(), protocol=4).hex())
print('mcore', pickle.dumps(build(MCoreMetadata, mcore_data={'model.w': {'nd_reformulated_orig_global_shape': (4, 6)}}), protocol=4).hex())
