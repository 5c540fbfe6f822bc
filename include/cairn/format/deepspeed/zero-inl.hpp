// cairn/format/deepspeed/zero-inl.hpp: the bodies of cairn/format/deepspeed/zero.hpp (included
// by it when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cairn/format/dcp/metadata.hpp"
#include "cairn/format/dcp/reader.hpp"
#include "cairn/format/deepspeed/zero.hpp"
#include "cairn/format/registry.hpp"
#include "cairn/format/torch/zip.hpp"
#include "cairn/plan/box.hpp"
#include "cairn/storage/pointer.hpp"

namespace cairn::detail {

/// What one DeepSpeed file holds, opened: its name in the storage and its archive.
struct deepspeed_file {
  std::string name;
  torch_zip::archive a;
  std::uint32_t index = 0;  ///< in the checkpoint's files
};

/// An errc::corrupt error about DeepSpeed file `file` (and key `key` when known).
inline error deepspeed_error(const std::string& msg,
                             const std::string& file,
                             std::string key = {}) {
  error e = make_error(errc::corrupt, "deepspeed checkpoint: " + msg).with_file(file);
  return key.empty() ? e : std::move(e).with_key(std::move(key));
}

/// The entries of a dict or of an OrderedDict (REDUCE + SETITEMS), or nullptr.
CAIRN_INLINE const std::vector<std::pair<pickle::value, pickle::value>>* deepspeed_entries(
    const pickle::value& v) {
  if (v.is_dict()) return v.entries.get();
  if (v.is_object() && v.obj->is("collections", "OrderedDict")) return &v.obj->dict_items;
  return nullptr;
}

/// The value under string key `key` of a dict or OrderedDict, or nullptr.
CAIRN_INLINE const pickle::value* deepspeed_get(const pickle::value& v, std::string_view key) {
  if (const auto* es = deepspeed_entries(v))
    for (const auto& [k, x] : *es)
      if (k.is_string() && k.str == key) return &x;
  return nullptr;
}

/// The ZeRO stage a `zero_stage` value says: an int, `ZeroStageEnum(2)` (Python <= 3.10 pickles
/// enums so) or `getattr(ZeroStageEnum, "gradients")` (3.11 and later).
CAIRN_INLINE std::optional<int> deepspeed_zero_stage(const pickle::value& v) {
  if (v.type == pickle::value::kind::integer) return static_cast<int>(v.i);
  if (!v.is_object()) return std::nullopt;
  const auto& args = v.obj->args.elements();
  if (v.obj->name == "ZeroStageEnum" && args.size() == 1 &&
      args[0].type == pickle::value::kind::integer)
    return static_cast<int>(args[0].i);
  if (v.obj->name == "getattr" && args.size() == 2 && args[1].is_string()) {
    static const std::map<std::string, int, std::less<>> by_name{
        {"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}};
    if (auto it = by_name.find(args[1].str); it != by_name.end()) return it->second;
  }
  return std::nullopt;
}

/// Reads the tag folder `latest` names when there is one (a DeepSpeed save folder): "" when
/// `st` is a tag folder itself.
CAIRN_INLINE result<std::string> deepspeed_tag(storage_ref st) {
  CAIRN_TRY_ASSIGN(bool has_latest, st.exists("latest"));
  if (!has_latest) return std::string();
  CAIRN_TRY_ASSIGN(std::optional<std::string> tag, read_pointer(st, "latest"));
  if (!tag) return deepspeed_error("the `latest` file names no tag folder", st.describe("latest"));
  return *tag + "/";
}

/// The data-parallel rank in an optimizer-states (or stage-3 model-states) file name
/// `[bf16_]zero_pp_rank_<r>_mp_rank_<mp>_<kind>.pt`, and its model-parallel rank.
CAIRN_INLINE std::optional<std::pair<int, int>> deepspeed_ranks(std::string_view name) {
  const std::size_t at = name.find("zero_pp_rank_");
  if (at == std::string_view::npos) return std::nullopt;
  name.remove_prefix(at + 13);
  auto number = [&]() -> std::optional<int> {
    int x = 0;
    std::size_t i = 0;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && i < 6; ++i)
      x = x * 10 + (name[i] - '0');
    if (i == 0) return std::nullopt;
    name.remove_prefix(i);
    return x;
  };
  auto dp = number();
  if (!dp || !name.starts_with("_mp_rank_")) return std::nullopt;
  name.remove_prefix(9);
  auto mp = number();
  if (!mp) return std::nullopt;
  return std::pair{*dp, *mp};
}

/// Adds to `r` the chunks of elements [begin, end) of a tensor of shape `dims` whose bytes lie
/// one after the other from byte `at` of file `file`.
CAIRN_INLINE void deepspeed_add_run(tensor_record& r,
                                    const shape& dims,
                                    std::int64_t begin,
                                    std::int64_t end,
                                    std::uint32_t file,
                                    std::uint64_t at) {
  if (end <= begin) return;
  const std::uint64_t es = dtype_size(r.type);
  for (const piece& p : flat_range_boxes(box{shape(dims.size(), 0), dims}, begin, end))
    r.chunks.push_back(chunk_record{p.region,
                                    extent{file,
                                           at + static_cast<std::uint64_t>(p.data_offset) * es,
                                           static_cast<std::uint64_t>(p.region.volume()) * es,
                                           {}},
                                    {}});
}

/// A 1-D tensor of a DeepSpeed file (a flat partition or fragment) and where its element 0 is.
struct deepspeed_flat {
  dtype type = dtype::f32;
  std::int64_t numel = 0;
  std::uint64_t at = 0;  ///< byte offset of element 0 in the file
  std::uint32_t file = 0;
};

/// The flat tensor `v` of file `f` (what `what` names in errors): contiguous, read in place.
CAIRN_INLINE result<deepspeed_flat> deepspeed_flat_of(const deepspeed_file& f,
                                                      const pickle::value& v,
                                                      const std::string& what) {
  auto t = torch_zip::as_tensor(v);
  if (!t) return deepspeed_error(what + " is not a tensor", f.name);
  if (!row_major(*t)) return deepspeed_error(what + " is not contiguous", f.name);
  const std::int64_t n = numel(t->dims);
  auto at = archive_bytes_at(f.a, *t, static_cast<std::uint64_t>(n) * dtype_size(t->type));
  if (!at) return std::move(at).err().with_file(f.name);
  return deepspeed_flat{t->type, n, *at, f.index};
}

/// A parameter's name and shape from a `param_shapes` entry (name -> torch.Size), checked.
CAIRN_INLINE result<std::pair<std::string, shape>> deepspeed_param(
    const std::pair<pickle::value, pickle::value>& e, const std::string& file) {
  if (!e.first.is_string()) return deepspeed_error("a parameter name is not a string", file);
  auto s = dcp::detail::as_shape(e.second);
  if (!s) return deepspeed_error("the parameter's shape is not a torch.Size", file, e.first.str);
  std::uint64_t n = 1;
  for (std::int64_t d : *s) {
    if (d < 0 || (d > 0 && n > (std::uint64_t{1} << 60) / static_cast<std::uint64_t>(d)))
      return deepspeed_error(
          "the parameter's shape " + dcp::detail::shape_str(*s) + " is negative or too large", file,
          e.first.str);
    n *= static_cast<std::uint64_t>(d);
  }
  return std::pair{e.first.str, *s};
}

/// Each group's (or, stage 3, sub-group's) parameters from `param_shapes`, in order.
CAIRN_INLINE result<std::vector<std::vector<std::pair<std::string, shape>>>> deepspeed_groups(
    const deepspeed_file& model) {
  const pickle::value* ps = deepspeed_get(model.a.root, "param_shapes");
  if (!ps || !ps->is_sequence())
    return deepspeed_error("the model states have no param_shapes list", model.name);
  std::vector<std::vector<std::pair<std::string, shape>>> out;
  for (const pickle::value& g : ps->elements()) {
    const auto* es = deepspeed_entries(g);
    if (!es) return deepspeed_error("a param_shapes entry is not a dict", model.name);
    auto& group = out.emplace_back();
    for (const auto& e : *es) {
      CAIRN_TRY_ASSIGN(auto p, deepspeed_param(e, model.name));
      group.push_back(std::move(p));
    }
  }
  return out;
}

/// Stages 1 and 2: group g's parameters lie one after the other in the concatenation of the
/// ranks' `single_partition_of_fp32_groups[g]` (padding cut off; the total padded to a multiple
/// of 2 x ranks).
CAIRN_INLINE result<void> deepspeed_stage12(
    const std::vector<std::vector<std::pair<std::string, shape>>>& groups,
    const std::vector<std::vector<deepspeed_flat>>& parts,  // [rank][group]
    const std::vector<deepspeed_file>& optim,
    checkpoint_metadata& m) {
  const std::int64_t world = static_cast<std::int64_t>(parts.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    std::vector<std::int64_t> start(parts.size() + 1, 0);  // of each rank's part in the group
    for (std::size_t r = 0; r < parts.size(); ++r) {
      if (g >= parts[r].size())
        return deepspeed_error("single_partition_of_fp32_groups has " +
                                   std::to_string(parts[r].size()) + " groups, param_shapes " +
                                   std::to_string(groups.size()),
                               optim[r].name);
      start[r + 1] = start[r] + parts[r][g].numel;
    }
    std::int64_t offset = 0;
    for (const auto& [name, dims] : groups[g]) {
      const std::int64_t n = numel(dims);
      if (n > start.back() - offset)
        return deepspeed_error("group " + std::to_string(g) + " holds " +
                                   std::to_string(start.back()) +
                                   " elements over the ranks, fewer than its parameters need",
                               optim.back().name, name);
      tensor_record rec;
      rec.type = parts[0][g].type;
      rec.global_shape = dims;
      for (std::size_t r = 0; r < parts.size(); ++r) {
        const deepspeed_flat& p = parts[r][g];
        if (p.type != rec.type)
          return deepspeed_error("the ranks' partitions differ in dtype", optim[r].name, name);
        const std::int64_t b = std::max(offset, start[r]), e = std::min(offset + n, start[r + 1]);
        if (b < e)
          deepspeed_add_run(rec, dims, b - offset, e - offset, p.file,
                            p.at + static_cast<std::uint64_t>(b - start[r]) * dtype_size(p.type));
      }
      offset += n;
      if (!m.tensors.emplace(name, std::move(rec)).second)
        return deepspeed_error("a parameter is in param_shapes twice", optim[0].name, name);
    }
    // As zero_to_fp32 checks: only the alignment padding is left over.
    const std::int64_t align = 2 * world;
    auto aligned = [&](std::int64_t x) { return (x + align - 1) / align * align; };
    if (aligned(offset) != aligned(start.back()))
      return deepspeed_error("group " + std::to_string(g) + "'s partitions hold " +
                                 std::to_string(start.back()) + " elements, its parameters " +
                                 std::to_string(offset),
                             optim[0].name);
  }
  return ok();
}

/// Stage 3: each parameter of sub-group s is cut into ceil(numel / ranks) elements per rank, and
/// rank r's `fp32_flat_groups[s]` holds its piece of each, in order (the last ranks' padded).
CAIRN_INLINE result<void> deepspeed_stage3(
    const std::vector<std::vector<std::pair<std::string, shape>>>& groups,
    const std::vector<std::vector<deepspeed_flat>>& parts,  // [rank][sub-group]
    const std::vector<deepspeed_file>& optim,
    checkpoint_metadata& m) {
  const std::int64_t world = static_cast<std::int64_t>(parts.size());
  for (std::size_t s = 0; s < groups.size(); ++s) {
    std::int64_t offset = 0;  // of each parameter's piece in every rank's flat group
    for (const auto& [name, dims] : groups[s]) {
      const std::int64_t n = numel(dims), per_rank = (n + world - 1) / world;
      tensor_record rec;
      rec.global_shape = dims;
      for (std::size_t r = 0; r < parts.size(); ++r) {
        if (s >= parts[r].size())
          return deepspeed_error("fp32_flat_groups has " + std::to_string(parts[r].size()) +
                                     " groups, param_shapes " + std::to_string(groups.size()),
                                 optim[r].name);
        const deepspeed_flat& p = parts[r][s];
        if (r == 0) rec.type = p.type;
        if (p.type != rec.type)
          return deepspeed_error("the ranks' partitions differ in dtype", optim[r].name, name);
        if (offset + per_rank > p.numel)
          return deepspeed_error("fp32_flat_groups[" + std::to_string(s) + "] holds " +
                                     std::to_string(p.numel) + " elements, fewer than its " +
                                     "parameters' partitions need",
                                 optim[r].name, name);
        const std::int64_t b = std::min(n, static_cast<std::int64_t>(r) * per_rank),
                           e = std::min(n, b + per_rank);
        deepspeed_add_run(rec, dims, b, e, p.file,
                          p.at + static_cast<std::uint64_t>(offset) * dtype_size(p.type));
      }
      offset += per_rank;
      if (!m.tensors.emplace(name, std::move(rec)).second)
        return deepspeed_error("a parameter is in param_shapes twice", optim[0].name, name);
    }
    for (std::size_t r = 0; r < parts.size(); ++r)
      if (parts[r][s].numel != offset)
        return deepspeed_error("fp32_flat_groups[" + std::to_string(s) + "] holds " +
                                   std::to_string(parts[r][s].numel) + " elements, its " +
                                   "parameters' partitions " + std::to_string(offset),
                               optim[r].name);
  }
  return ok();
}

/// Buffers (`buffer_names`, from `module`, whole) and frozen parameters: stage 2 keeps each whole
/// in `frozen_param_fragments`, stage 3 one fragment per rank's model-states file, concatenated.
CAIRN_INLINE result<void> deepspeed_buffers_and_frozen(const std::vector<deepspeed_file>& models,
                                                       checkpoint_metadata& m) {
  const deepspeed_file& m0 = models[0];
  const pickle::value* module = deepspeed_get(m0.a.root, "module");
  const pickle::value* names = deepspeed_get(m0.a.root, "buffer_names");
  if (module && names && names->is_sequence()) {
    for (const pickle::value& b : names->elements()) {
      if (!b.is_string()) continue;
      const pickle::value* t = deepspeed_get(*module, b.str);
      auto ref = t ? torch_zip::as_tensor(*t) : std::nullopt;
      if (!ref) continue;  // a non-persistent buffer is listed but not saved
      CAIRN_TRY_ASSIGN(deepspeed_flat f, deepspeed_flat_of(m0, *t, "buffer " + b.str));
      tensor_record rec;
      rec.type = f.type;
      rec.global_shape = ref->dims;
      deepspeed_add_run(rec, ref->dims, 0, f.numel, f.file, f.at);
      if (!m.tensors.emplace(b.str, std::move(rec)).second)
        return deepspeed_error("a buffer is also a parameter", m0.name, b.str);
    }
  }
  const pickle::value* shapes = deepspeed_get(m0.a.root, "frozen_param_shapes");
  const auto* frozen = shapes ? deepspeed_entries(*shapes) : nullptr;
  if (!frozen) return ok();  // stage 1 records none (None)
  for (const auto& e : *frozen) {
    CAIRN_TRY_ASSIGN(auto p, deepspeed_param(e, m0.name));
    const auto& [name, dims] = p;
    const std::int64_t n = numel(dims);
    tensor_record rec;
    std::int64_t at = 0;  // elements of the parameter the files before held
    for (const deepspeed_file& f : models) {
      if (at >= n) break;
      const pickle::value* frags = deepspeed_get(f.a.root, "frozen_param_fragments");
      const pickle::value* t = frags ? deepspeed_get(*frags, name) : nullptr;
      if (!t) return deepspeed_error("a frozen parameter has no fragment", f.name, name);
      CAIRN_TRY_ASSIGN(deepspeed_flat frag, deepspeed_flat_of(f, *t, "frozen parameter " + name));
      if (at == 0) rec.type = frag.type;
      if (frag.type != rec.type)
        return deepspeed_error("the ranks' fragments differ in dtype", f.name, name);
      const std::int64_t take = std::min(frag.numel, n - at);
      rec.global_shape = dims;
      deepspeed_add_run(rec, dims, at, at + take, frag.file, frag.at);
      at += take;
    }
    if (at < n)
      return deepspeed_error("the frozen parameter's fragments hold " + std::to_string(at) +
                                 " of its " + std::to_string(n) + " elements",
                             models.back().name, name);
    if (!m.tensors.emplace(name, std::move(rec)).second)
      return deepspeed_error("a frozen parameter is also trainable", m0.name, name);
  }
  return ok();
}

/// Tied parameters (`shared_params`, alias -> stored name): the alias reads the stored one.
CAIRN_INLINE void deepspeed_shared(const deepspeed_file& m0, checkpoint_metadata& m) {
  const pickle::value* shared = deepspeed_get(m0.a.root, "shared_params");
  const auto* es = shared ? deepspeed_entries(*shared) : nullptr;
  if (!es) return;
  for (const auto& [alias, target] : *es) {
    if (!alias.is_string() || !target.is_string()) continue;
    auto it = m.tensors.find(target.str);
    if (it != m.tensors.end() && !m.tensors.count(alias.str)) {
      tensor_record copy = it->second;
      m.tensors.emplace(alias.str, std::move(copy));
    }
  }
}

CAIRN_INLINE result<bool> holds_deepspeed(storage_ref st) {
  auto tag = deepspeed_tag(st);
  if (!tag) return false;  // a `latest` of something else
  CAIRN_TRY_ASSIGN(std::vector<std::string> names, st.list(*tag));
  return std::any_of(names.begin(), names.end(), [&](const std::string& full) {
    if (!full.starts_with(*tag)) return false;
    std::string_view n = std::string_view(full).substr(tag->size());
    return n.find('/') == std::string_view::npos && n.ends_with("_optim_states.pt") &&
           deepspeed_ranks(n).has_value();
  });
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE result<checkpoint_metadata> deepspeed_as_metadata(storage_ref st) {
  using namespace detail;
  CAIRN_TRY_ASSIGN(std::string tag, deepspeed_tag(st));
  CAIRN_TRY_ASSIGN(std::vector<std::string> listed, st.list(tag));
  std::vector<std::pair<int, std::string>> optim_names, model_names;  // by data-parallel rank
  std::string model12;
  for (const std::string& full : listed) {
    if (!full.starts_with(tag)) continue;
    const std::string n = full.substr(tag.size());
    if (n.find('/') != std::string::npos) continue;
    auto ranks = deepspeed_ranks(n);
    if (n.starts_with("mp_rank_") && n.ends_with("_model_states.pt")) {
      if (n != "mp_rank_00_model_states.pt")
        return make_error(errc::unsupported_version,
                          "deepspeed checkpoint: model parallelism (" + n +
                              "): each model-parallel rank's parameters are shards only the "
                              "model knows how to join; not read")
            .with_file(st.describe(tag + n));
      model12 = tag + n;
    } else if (ranks && n.ends_with("_optim_states.pt")) {
      if (ranks->second != 0)
        return make_error(errc::unsupported_version,
                          "deepspeed checkpoint: model parallelism (" + n + "): not read")
            .with_file(st.describe(tag + n));
      optim_names.emplace_back(ranks->first, tag + n);
    } else if (ranks && n.ends_with("_model_states.pt") && ranks->second == 0) {
      model_names.emplace_back(ranks->first, tag + n);
    }
  }
  if (optim_names.empty())
    return make_error(errc::not_found,
                      "no DeepSpeed ZeRO optimizer states (zero_pp_rank_<r>_mp_rank_00_optim_"
                      "states.pt) here")
        .with_file(st.describe(tag));
  std::sort(optim_names.begin(), optim_names.end());
  std::sort(model_names.begin(), model_names.end());
  for (std::size_t r = 0; r < optim_names.size(); ++r)
    if (optim_names[r].first != static_cast<int>(r))
      return make_error(errc::corrupt, "deepspeed checkpoint: the optimizer states of rank " +
                                           std::to_string(r) + " are missing")
          .with_file(st.describe(tag));
  checkpoint_metadata m;
  m.format = "deepspeed";
  m.block_size = foreign_read_block;
  m.save_id = "zero";
  m.world_size = static_cast<int>(optim_names.size());
  std::map<std::string, std::uint32_t> files;
  auto open = [&](const std::string& name) -> result<deepspeed_file> {
    CAIRN_TRY_ASSIGN(torch_zip::archive a, torch_zip::open_archive(st, name));
    CAIRN_TRY_ASSIGN(std::uint32_t fi, file_index_of(st, m, files, name));
    return deepspeed_file{st.describe(name), std::move(a), fi};
  };
  std::vector<deepspeed_file> optim;
  for (const auto& [r, name] : optim_names) {
    CAIRN_TRY_ASSIGN(deepspeed_file f, open(name));
    optim.push_back(std::move(f));
  }
  // The stage and the partitions, rank by rank.
  int stage = -1;
  std::vector<std::vector<deepspeed_flat>> parts;
  for (const deepspeed_file& f : optim) {
    const pickle::value* osd = deepspeed_get(f.a.root, "optimizer_state_dict");
    if (!osd) return deepspeed_error("no optimizer_state_dict", f.name);
    const pickle::value* zs = deepspeed_get(*osd, "zero_stage");
    if (!zs)
      return make_error(errc::unsupported_version,
                        "deepspeed checkpoint: the optimizer states name no ZeRO stage "
                        "(DeepSpeed's BF16_Optimizer); zero_to_fp32 refuses them too")
          .with_file(f.name);
    auto s = deepspeed_zero_stage(*zs);
    if (!s || *s < 1 || *s > 3)
      return deepspeed_error("zero_stage is not a ZeRO stage 1, 2 or 3 (" + zs->describe() + ")",
                             f.name);
    if (stage != -1 && *s != stage)
      return deepspeed_error("the ranks' files name different ZeRO stages", f.name);
    stage = *s;
    // partition_count: a list per group (stages 1, 2) or an int (stage 3), the ranks saved.
    if (const pickle::value* pc = deepspeed_get(*osd, "partition_count")) {
      std::vector<pickle::value> counts =
          pc->is_sequence() ? pc->elements() : std::vector<pickle::value>{*pc};
      for (const pickle::value& c : counts)
        if (c.type == pickle::value::kind::integer &&
            c.i != static_cast<std::int64_t>(optim.size()))
          return deepspeed_error("saved by " + std::to_string(c.i) + " data-parallel ranks, but " +
                                     std::to_string(optim.size()) +
                                     " optimizer-states files are here",
                                 f.name);
    }
    const char* key = stage == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups";
    const pickle::value* groups = deepspeed_get(*osd, key);
    if (!groups || !groups->is_sequence())
      return deepspeed_error(std::string("no ") + key + " list", f.name);
    auto& mine = parts.emplace_back();
    for (std::size_t g = 0; g < groups->elements().size(); ++g) {
      CAIRN_TRY_ASSIGN(deepspeed_flat p,
                       deepspeed_flat_of(f, groups->elements()[g],
                                         std::string(key) + "[" + std::to_string(g) + "]"));
      mine.push_back(p);
    }
  }
  // The model states: one file (stages 1, 2) or one per rank (stage 3).
  std::vector<deepspeed_file> models;
  if (stage == 3) {
    if (model_names.size() != optim.size())
      return make_error(errc::corrupt,
                        "deepspeed checkpoint: stage 3 needs a model-states file "
                        "per rank (zero_pp_rank_<r>_mp_rank_00_model_states.pt); " +
                            std::to_string(model_names.size()) + " of " +
                            std::to_string(optim.size()) + " are here")
          .with_file(st.describe(tag));
    for (const auto& [r, name] : model_names) {
      CAIRN_TRY_ASSIGN(deepspeed_file f, open(name));
      models.push_back(std::move(f));
    }
  } else {
    if (model12.empty())
      return make_error(errc::corrupt,
                        "deepspeed checkpoint: mp_rank_00_model_states.pt is missing")
          .with_file(st.describe(tag));
    CAIRN_TRY_ASSIGN(deepspeed_file f, open(model12));
    models.push_back(std::move(f));
  }
  if (const pickle::value* mp = deepspeed_get(models[0].a.root, "mp_world_size"))
    if (mp->type == pickle::value::kind::integer && mp->i != 1)
      return make_error(errc::unsupported_version,
                        "deepspeed checkpoint: model parallelism (mp_world_size " +
                            std::to_string(mp->i) + "): not read")
          .with_file(models[0].name);
  CAIRN_TRY_ASSIGN(auto groups, deepspeed_groups(models[0]));
  if (stage == 3)
    CAIRN_TRY(deepspeed_stage3(groups, parts, optim, m));
  else
    CAIRN_TRY(deepspeed_stage12(groups, parts, optim, m));
  CAIRN_TRY(deepspeed_buffers_and_frozen(models, m));
  deepspeed_shared(models[0], m);
  // The counters, as common values.
  for (const char* k : {"global_steps", "global_samples", "skipped_steps", "dp_world_size",
                        "mp_world_size", "ds_version"})
    if (const pickle::value* v = deepspeed_get(models[0].a.root, k))
      if (auto c = common_from_pickle(*v)) m.inline_commons.emplace(k, std::move(*c));
  m.inline_commons.emplace("zero_stage", common_value::of(std::int64_t{stage}));
  return m;
}

}  // namespace cairn
