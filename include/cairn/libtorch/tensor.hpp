// cairn/libtorch/tensor.hpp: a libtorch tensor as a leaf of a state tree (target cairn::torch).
//
// A `torch::Tensor` is saved from, and loaded in place into, its own storage: contiguous CPU
// tensors directly, CUDA tensors through cairn's staging (pass `save_options::cuda_runtime`),
// non-contiguous tensors through a contiguous copy that a load copies back. Complex tensors are
// stored as their real view (`torch::view_as_real`: a trailing axis of 2); quantized tensors are
// refused.
#pragma once

#include <ATen/MemoryOverlap.h>
#include <torch/types.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cairn/core/dtype.hpp"
#include "cairn/core/error.hpp"
#include "cairn/core/sharded_tensor.hpp"
#include "cairn/load.hpp"
#include "cairn/tree/fields.hpp"
#include "cairn/tree/state_dict.hpp"

namespace cairn::libtorch {

/// cairn's dtype for the elements of a torch scalar type; a complex type maps to the dtype of
/// its real and imaginary parts. nullopt for quantized types.
inline std::optional<dtype> to_dtype(c10::ScalarType s) noexcept {
  switch (s) {
    case c10::ScalarType::Bool:
      return dtype::bool_;
    case c10::ScalarType::Byte:
      return dtype::u8;
    case c10::ScalarType::Char:
      return dtype::i8;
    case c10::ScalarType::Short:
      return dtype::i16;
    case c10::ScalarType::Int:
      return dtype::i32;
    case c10::ScalarType::Long:
      return dtype::i64;
    case c10::ScalarType::Half:
    case c10::ScalarType::ComplexHalf:
      return dtype::f16;
    case c10::ScalarType::BFloat16:
      return dtype::bf16;
    case c10::ScalarType::Float:
    case c10::ScalarType::ComplexFloat:
      return dtype::f32;
    case c10::ScalarType::Double:
    case c10::ScalarType::ComplexDouble:
      return dtype::f64;
    default:
      return std::nullopt;
  }
}

/// The torch scalar type holding cairn's `t`; nullopt for dtypes libtorch 1.13 lacks (U16,
/// U32, U64, F8_E4M3, F8_E5M2).
inline std::optional<c10::ScalarType> to_scalar_type(dtype t) noexcept {
  for (auto s :
       {c10::ScalarType::Bool, c10::ScalarType::Byte, c10::ScalarType::Char, c10::ScalarType::Short,
        c10::ScalarType::Int, c10::ScalarType::Long, c10::ScalarType::Half,
        c10::ScalarType::BFloat16, c10::ScalarType::Float, c10::ScalarType::Double})
    if (to_dtype(s) == t) return s;
  return std::nullopt;
}

/// Where a tensor's block sits in the global tensor (every field optional: the default is a
/// whole tensor written by this rank, keyed by its path in the tree).
struct placement {
  std::string key;                 ///< the global key; empty: the leaf's path in the tree
  std::vector<axis_split> splits;  ///< even splits of the global tensor (`from_rank_offsets`)
  int replica_id = 0;  ///< 0 on the rank that writes this block (or flat slice); others skip it
  int prepend_axis_num = 0;          ///< leading global axes of size 1 the tensor lacks
  std::optional<shape> block_shape;  ///< the block's shape when the tensor holds a flat slice
  std::optional<flat_range> flat;    ///< the slice of the flattened block the tensor holds
};

namespace detail {

/// A cairn error naming `key` (when known) for a tensor that cannot be a leaf.
inline exception tensor_error(errc code, const std::string& key, std::string message) {
  auto e = make_error(code, std::move(message));
  return exception(key.empty() ? std::move(e) : std::move(e).with_key(key));
}

/// The real tensor whose bytes stand for `t`: `t` itself, or its real view when complex.
inline ::torch::Tensor real_view(const ::torch::Tensor& t) {
  return t.is_complex() ? ::torch::view_as_real(t) : t;
}

/// `real_view(t)` of a tensor that can be saved and loaded; throws for undefined, quantized,
/// sparse and non-CPU/CUDA tensors and for conjugate or negative views.
inline ::torch::Tensor storable(const ::torch::Tensor& t, const std::string& key) {
  if (!t.defined())
    throw tensor_error(errc::invalid_argument, key,
                       "undefined torch::Tensor in the state tree (default-constructed?)");
  if (t.is_quantized())
    throw tensor_error(errc::invalid_argument, key,
                       std::string("quantized tensor (") + c10::toString(t.scalar_type()) +
                           ") cannot be saved: store t.int_repr() and its scale and zero point");
  if (t.layout() != c10::kStrided)
    throw tensor_error(errc::invalid_argument, key,
                       "sparse or mkldnn tensor cannot be saved: convert it with to_dense()");
  if (!t.device().is_cpu() && !t.device().is_cuda())
    throw tensor_error(errc::invalid_argument, key,
                       "tensor on device " + t.device().str() + ": only CPU and CUDA tensors");
  if (t.is_conj() || t.is_neg())
    throw tensor_error(errc::invalid_argument, key,
                       "conjugate or negative view: call resolve_conj()/resolve_neg() first");
  return real_view(t);
}

/// The sharding of the block `real` (the storable form of a tensor) holds, as `p` says.
inline tensor_sharding sharding_of(const ::torch::Tensor& real, const placement& p, bool complex) {
  std::optional<dtype> type = to_dtype(real.scalar_type());
  if (!type)
    throw tensor_error(errc::invalid_argument, p.key,
                       std::string("unsupported dtype ") + c10::toString(real.scalar_type()));
  shape block(real.sizes().begin(), real.sizes().end());
  if (p.flat) {
    if (!p.block_shape || real.dim() != (complex ? 2 : 1))
      throw tensor_error(errc::invalid_argument, p.key,
                         "a flat slice needs placement::block_shape and a 1-D tensor");
    block = *p.block_shape;
    if (complex) block.push_back(2);
  } else if (p.block_shape) {
    throw tensor_error(errc::invalid_argument, p.key,
                       "placement::block_shape is for flat slices (set placement::flat too)");
  }
  tensor_sharding s = rank_offsets_sharding(p.key, *type, std::move(block), p.splits, p.replica_id,
                                            p.prepend_axis_num);
  if (p.flat) {
    flat_range r = *p.flat;
    if (complex) r = {r.begin * 2, r.end * 2};  // in elements of the real view
    s.flattened_range = r;
  }
  return s;
}

}  // namespace detail

/// A leaf over `t`, placed as `p` says. Saving reads `t`'s memory; loading writes into it in
/// place: contiguous CPU and CUDA tensors directly (CUDA through the staging pool), other
/// tensors through a contiguous copy written back after the load (refused when elements of `t`
/// overlap, as in `expand()`). The tensor handle is shared, so the factory stays valid as long
/// as the tensor lives; build it again after the tensor is replaced.
///
///     sd.add("wte", cairn::libtorch::tensor(model->wte->weight, {.splits = {{0, tp, tp_size}}}));
inline factory tensor(::torch::Tensor t, placement p = {}) {
  factory f;
  f.build = [t, p]() {
    ::torch::Tensor real = detail::storable(t, p.key);
    tensor_sharding s = detail::sharding_of(real, p, t.is_complex());
    auto staged =
        std::make_shared<::torch::Tensor>(real.is_contiguous() ? real : real.contiguous());
    sharded_tensor<> leaf;
    static_cast<tensor_sharding&>(leaf) = std::move(s);
    leaf.data = {static_cast<std::byte*>(staged->data_ptr()), staged->nbytes()};
    state_dict d;
    d.add("", leaf);
    d.keep_alive(std::move(staged));
    return d;
  };
  f.merge = [t, p](state_dict& built) -> result<void> {
    const auto* leaf = std::get_if<sharded_tensor<>>(built.find(""));
    if (!leaf) return ok();
    ::torch::Tensor real = detail::real_view(t);
    if (leaf->data.data() == static_cast<std::byte*>(real.data_ptr())) {
      if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();  // written behind autograd
      return ok();
    }
    if (at::has_internal_overlap(real) == at::MemOverlap::Yes)
      return make_error(errc::invalid_argument,
                        "cannot load into a tensor whose elements share memory (expand()?); "
                        "load into a contiguous tensor")
          .with_key(p.key);
    ::torch::NoGradGuard no_grad;
    real.copy_(
        ::torch::from_blob(leaf->data.data(), real.sizes(), real.options().requires_grad(false)));
    return ok();
  };
  return f;
}

/// A new CPU tensor holding a whole tensor read by `cairn::load_tensors` (a copy of its bytes),
/// the way `torch::load` returns fresh tensors:
///
///     for (auto& [key, t] : cairn::load_tensors(storage).value())
///       named[key] = cairn::libtorch::to_tensor(t);
///
/// Throws `cairn::exception` for dtypes libtorch 1.13 lacks (U16, U32, U64, F8) and for data
/// whose size does not match the shape.
inline ::torch::Tensor to_tensor(const tensor_data& t) {
  std::optional<c10::ScalarType> type = to_scalar_type(t.type);
  if (!type)
    throw exception(make_error(errc::invalid_argument, "libtorch 1.13 has no dtype for " +
                                                           std::string(dtype_name(t.type))));
  std::optional<std::int64_t> n = checked_numel(t.global_shape, dtype_size(t.type));
  if (!n || static_cast<std::size_t>(*n) * dtype_size(t.type) != t.data.size())
    throw exception(make_error(errc::corrupt, "tensor data holds " + std::to_string(t.data.size()) +
                                                  " bytes, not what its shape needs"));
  ::torch::Tensor out = ::torch::empty(t.global_shape, ::torch::TensorOptions().dtype(*type));
  if (!t.data.empty()) std::memcpy(out.data_ptr(), t.data.data(), t.data.size());
  return out;
}

}  // namespace cairn::libtorch

namespace cairn {

/// A bare `torch::Tensor` in a tree (a struct field, a map value) is a whole, unsharded tensor
/// keyed by its path, written by every rank's replica 0: give it a `libtorch::tensor` with a
/// placement to shard it.
template <>
struct adapter<::torch::Tensor> {
  static factory view(::torch::Tensor& t) { return libtorch::tensor(t); }
};

}  // namespace cairn
