// tests/format/conformance.hpp: the tables of the format conformance suite. Every way cairn
// writes a checkpoint is a WRITER (the save strategies, `convert`, `unshard`); every way it
// reads one back is a READER (`load` on M ranks in three shardings and with read-once
// broadcast, `convert::open_source` boxes, `consolidate`, `read_any_metadata`, `load_tensors`,
// `verify_checkpoint`). conformance_test.cpp runs every writer × every reader × N→M topology ×
// dtype and compares bytes exactly.
//
// A new on-disk format plugs in here: one `format_row` in `format_rows()` (its save and convert
// writers follow from its registered names; the dtypes its format cannot represent go in
// `cannot_hold`); a new way of reading goes in `readers()`.
// What fails today because of the library is listed in `known_gaps()`, with the reason; the
// suite checks that each still fails, so a fix shows up. Nothing else changes.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/convert/source.hpp"
#include "cairn/convert/unshard.hpp"
#include "cairn/plan/cover.hpp"
#include "cairn/strategies.hpp"
#include "tests/format/rawdir/driver.hpp"
#include "tests/support/property.hpp"

namespace cairn_test::conformance {

namespace cv = cairn::convert;

/// Every object in `st` by name, with its bytes.
inline std::map<std::string, std::vector<std::byte>> all_files(cairn::memory_storage& st) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& name : st.list("").value()) {
    std::vector<std::byte> b(st.size(name).value());
    st.read(name, 0, b).value();
    out.emplace(name, std::move(b));
  }
  return out;
}

/// Saves the case on `n` thread ranks (shards laid out as `kind`) with `so`; returns the save
/// id (random per save, part of file names and metadata).
inline std::string save_case(cairn::storage_ref st,
                             const property_case& c,
                             int n,
                             layout_kind kind,
                             const cairn::save_options& so) {
  auto ids = cairn::run_ranks_collect(n, [&](cairn::thread_communicator& comm) {
    rank_state rs;
    build_rank(rs, c.specs, c.save_grids, comm.rank(), n, true, kind);
    return cairn::save(rs.sd, st, comm, so).save_id;
  });
  return ids.at(0);
}

/// What a writer is: how it writes, and what its output must look like.
struct writer {
  std::string name;
  /// What `read_any_metadata` calls its output: "cairn", "torch_dist" or "safetensors".
  std::string format;
  /// Whether its output holds checksums (`verify_checkpoint` recomputes them).
  bool checksummed = false;
  /// Whether an object name is one of the layout's own files (nothing else may be left).
  std::function<bool(const std::string&)> owns_file;
  /// Writes the state of `c` saved on `n` thread ranks (shards laid out as `kind`) into `out`;
  /// returns the random save id the output carries ("" when it has none: the output is then
  /// byte-identical across runs; otherwise it is identical once the id is masked).
  std::function<std::string(
      cairn::memory_storage& out, const property_case& c, int n, layout_kind kind)>
      write;
  /// Whether this output shows the feature the writer exists to exercise (tiles, compressed
  /// blocks, several files, several slabs per tensor); the suite checks that some output does.
  std::function<bool(cairn::memory_storage& out, const property_case& c)> exercised;
  /// The dtypes its format cannot represent: it must refuse them (errc::invalid_argument,
  /// naming the dtype) and write nothing. The matrix gives it every other dtype.
  std::vector<cairn::dtype> cannot_hold;

  /// The dtypes it holds.
  std::vector<cairn::dtype> holds() const {
    std::vector<cairn::dtype> out;
    for (cairn::dtype t : cairn::all_dtypes)
      if (std::find(cannot_hold.begin(), cannot_hold.end(), t) == cannot_hold.end())
        out.push_back(t);
    return out;
  }
};

/// True for the files of a native checkpoint.
inline bool native_file(const std::string& f) {
  return f == "metadata.json" || f.ends_with(".cairn");
}
/// True for the files of a torch_dist (DCP + Megatron) checkpoint.
inline bool torch_dist_file(const std::string& f) {
  return f == ".metadata" || f == "metadata.json" || f == "common.pt" || f.ends_with(".distcp");
}
/// True for the files of a safetensors checkpoint.
inline bool safetensors_file(const std::string& f) {
  return f.ends_with(".safetensors") || f == "model.safetensors.index.json";
}

/// The number of objects in `st` whose name ends with `suffix`.
inline std::size_t count_files(cairn::memory_storage& st, std::string_view suffix) {
  std::size_t n = 0;
  for (const auto& f : st.list("").value()) n += f.ends_with(suffix);
  return n;
}

/// True when some tensor of the checkpoint in `st` has more chunks than its shape needs whole:
/// the writer cut it (tiles of a native save, slabs of a conversion, N-d boxes of a DCP save).
inline bool some_tensor_in_pieces(cairn::memory_storage& st) {
  auto m = cairn::read_any_metadata(st).value();
  for (const auto& [k, t] : m.tensors)
    if (t.chunks.size() > 1) return true;
  return false;
}

/// The file-name test of an output format.
inline std::function<bool(const std::string&)> owns_files_of(cv::output_format f) {
  if (f == cv::output_format::native) return native_file;
  if (f == cv::output_format::torch_dist) return torch_dist_file;
  return safetensors_file;
}

/// What `read_any_metadata` calls an output format's checkpoints.
inline std::string format_of(cv::output_format f) {
  if (f == cv::output_format::native) return "cairn";
  if (f == cv::output_format::torch_dist) return "torch_dist";
  return "safetensors";
}

/// Whether an output of format `f` shows what the writer exercises: several files (chunks),
/// one file per tensor (per_tensor), or a tensor written in several slabs (the others).
inline std::function<bool(cairn::memory_storage&, const property_case&)> exercised_by(
    cv::output_format f) {
  if (f == cv::output_format::chunks)
    return [](cairn::memory_storage& st, const property_case&) {
      return count_files(st, ".safetensors") > 1;
    };
  if (f == cv::output_format::per_tensor)
    return [](cairn::memory_storage& st, const property_case& c) {
      return count_files(st, ".safetensors") == c.specs.size();
    };
  if (f == cv::output_format::one_file)
    return [](cairn::memory_storage& st, const property_case&) {
      return count_files(st, ".safetensors") == 1;
    };
  return [](cairn::memory_storage& st, const property_case&) { return some_tensor_in_pieces(st); };
}

/// The save strategies shared by the writers (a strategy must outlive the saves using it).
struct strategies {
  cairn::torch_dist_strategy torch_dist;
  cairn::torch_dist_strategy torch_dist_1_13{cairn::dcp::flavor::torch1_13};
  cairn::safetensors_strategy one_file{cairn::safetensors::file_split::one_file};
  cairn::safetensors_strategy per_tensor{cairn::safetensors::file_split::per_tensor};
  // Small chunks and slabs: several files, several slabs per tensor.
  cairn::safetensors_strategy chunks{cairn::safetensors::file_split::chunks, 600, 256};
};

/// A writer that saves with `so` (strategy included).
inline writer save_writer(std::string name,
                          std::string format,
                          bool checksummed,
                          std::function<bool(const std::string&)> owns,
                          cairn::save_options so,
                          std::function<bool(cairn::memory_storage&, const property_case&)> ex) {
  return {std::move(name),
          std::move(format),
          checksummed,
          std::move(owns),
          [so](cairn::memory_storage& out, const property_case& c, int n, layout_kind kind) {
            return save_case(out, c, n, kind, so);
          },
          std::move(ex)};
}

/// A writer that saves the state natively on N ranks (tiled, small blocks) or with `source_so`,
/// opens it with `open_source` and rewrites it with `convert` (or `unshard`) as `opt` says; its
/// output is `format` (checksummed or not), made of the files `owns`.
inline writer convert_writer_to(
    std::string name,
    cv::convert_options opt,
    bool use_unshard,
    cairn::save_options source_so,
    std::string format,
    bool checksummed,
    std::function<bool(const std::string&)> owns,
    std::function<bool(cairn::memory_storage&, const property_case&)> ex) {
  return {std::move(name),
          std::move(format),
          checksummed,
          std::move(owns),
          [opt, use_unshard, source_so](cairn::memory_storage& out, const property_case& c, int n,
                                        layout_kind kind) {
            cairn::memory_storage src_storage;
            save_case(src_storage, c, n, kind, source_so);
            auto src = cv::open_source(src_storage).value();
            if (use_unshard)
              cv::unshard(*src, out, opt).value();
            else
              cv::convert(*src, out, opt).value();
            return std::string();  // convert's output is deterministic: no random id
          },
          std::move(ex)};
}

/// `convert_writer_to` for a built-in output format (`opt.format`).
inline writer convert_writer(std::string name,
                             cv::convert_options opt,
                             bool use_unshard,
                             cairn::save_options source_so) {
  return convert_writer_to(std::move(name), opt, use_unshard, std::move(source_so),
                           format_of(opt.format), opt.format == cv::output_format::native,
                           owns_files_of(opt.format), exercised_by(opt.format));
}

/// A format as the suite needs to know it, beyond what the registry says: the save strategy and
/// the stream writer called `name` write it (both made by name), and the row gives what its
/// output must look like. `format_writers` turns a row into its save and convert writers.
struct format_row {
  std::string name;    ///< its save strategy's and stream writer's name
  std::string format;  ///< what `detect_format` calls its output
  bool checksummed = false;
  std::function<bool(const std::string&)> owns_file;
  std::function<bool(cairn::memory_storage&, const property_case&)> exercised;
  std::vector<cairn::dtype> cannot_hold;
};

/// The writers of a registered format: "NAME", a save on N ranks with the strategy
/// `make_save_strategy(NAME)` makes, and "convert:NAME", `convert` with `writer = NAME`.
inline std::vector<writer> format_writers(const format_row& row) {
  static std::vector<std::unique_ptr<cairn::save_strategy>> made;  // outlive the saves
  made.push_back(cairn::make_save_strategy(row.name).value());
  cairn::save_options so;
  so.strategy = made.back().get();
  so.block_size = 96;
  std::vector<writer> out;
  out.push_back(
      save_writer(row.name, row.format, row.checksummed, row.owns_file, so, row.exercised));
  cv::convert_options opt;
  opt.writer = row.name;
  opt.slab_bytes = 48;  // several slabs per tensor, several tensors per slab
  cairn::save_options source_so;
  source_so.block_size = 128;
  out.push_back(convert_writer_to("convert:" + row.name, opt, false, source_so, row.format,
                                  row.checksummed, row.owns_file, row.exercised));
  for (auto& w : out) w.cannot_hold = row.cannot_hold;
  return out;
}

/// The formats registered from the tests folder (a new format's one row goes here).
inline std::vector<format_row> format_rows() {
  return {
      {std::string(rawdir::id),
       std::string(rawdir::id),
       false,
       [](const std::string& f) { return f == rawdir::catalog_name || f.ends_with(".raw"); },
       [](cairn::memory_storage& st, const property_case&) { return some_tensor_in_pieces(st); },
       {}},
  };
}

/// The dtypes torch 1.13 has no torch.<name> for (uint16/32/64 came in torch 2.3, float8 in
/// 2.1), so a DCP checkpoint in its flavor cannot name them.
inline const std::vector<cairn::dtype> torch_1_13_lacks = {cairn::dtype::u16, cairn::dtype::u32,
                                                           cairn::dtype::u64, cairn::dtype::f8_e4m3,
                                                           cairn::dtype::f8_e5m2};

/// Every writer: the save strategies (native plain, zstd, tiled in small blocks, untiled, all in
/// format versions 1-3, and native_index in version 4, the default;
/// torch_dist for torch 2.x and 1.13; the three safetensors layouts) and the converters
/// (`convert` into every output format from a native checkpoint, DCP for torch 1.13 too;
/// `unshard` from native and from torch_dist sources).
inline const std::vector<writer>& writers() {
  static const strategies s;
  static const std::vector<writer> all = [] {
    std::vector<writer> w;
    // The native writers of versions 1 to 3 pin index_files off; native_index is the default.
    cairn::save_options plain;
    plain.index_files = false;
    w.push_back(save_writer("native", "cairn", true, native_file, plain,
                            [](cairn::memory_storage& st, const property_case&) {
                              return cairn::read_metadata(st).value().version == 1;
                            }));
    cairn::save_options zstd;
    zstd.zstd_level = 1;
    zstd.block_size = 96;
    zstd.index_files = false;
    w.push_back(save_writer("native_zstd", "cairn", true, native_file, zstd,
                            [](cairn::memory_storage& st, const property_case&) {
                              return cairn::read_metadata(st).value().version == 3;
                            }));
    cairn::save_options tiled;
    tiled.block_size = 64;
    tiled.index_files = false;
    w.push_back(save_writer("native_tiled", "cairn", true, native_file, tiled,
                            [](cairn::memory_storage& st, const property_case&) {
                              return cairn::read_metadata(st).value().version == 2;
                            }));
    cairn::save_options untiled = tiled;
    untiled.tile = false;
    w.push_back(save_writer("native_untiled", "cairn", true, native_file, untiled,
                            [](cairn::memory_storage& st, const property_case&) {
                              auto m = cairn::read_metadata(st).value();
                              for (const auto& [k, t] : m.tensors)
                                for (const auto& ch : t.chunks)
                                  if (ch.where.checksums.size() > 1) return m.version == 1;
                              return false;  // every chunk in one block: nothing to show
                            }));
    cairn::save_options indexed;  // the defaults (format version 5) with small blocks
    indexed.block_size = 64;
    w.push_back(save_writer("native_index", "cairn", true, native_file, indexed,
                            [](cairn::memory_storage& st, const property_case&) {
                              return cairn::read_metadata(st).value().version == 5 &&
                                     !st.list("index.").value().empty();
                            }));
    cairn::save_options owners = indexed;  // planned by key owners whatever the world's size
    owners.scalable_planning = true;
    w.push_back(save_writer("native_key_owners", "cairn", true, native_file, owners,
                            [](cairn::memory_storage& st, const property_case&) {
                              return cairn::read_metadata(st).value().version == 5;
                            }));
    cairn::save_options td;
    td.strategy = &s.torch_dist;
    w.push_back(save_writer("torch_dist", "torch_dist", false, torch_dist_file, td,
                            [](cairn::memory_storage& st, const property_case&) {
                              return count_files(st, ".distcp") > 1;
                            }));
    cairn::save_options td_1_13;
    td_1_13.strategy = &s.torch_dist_1_13;
    w.push_back(save_writer("torch_dist(torch 1.13)", "torch_dist", false, torch_dist_file, td_1_13,
                            [](cairn::memory_storage& st, const property_case&) {
                              return count_files(st, ".distcp") > 1;
                            }));
    w.back().cannot_hold = torch_1_13_lacks;
    const std::pair<const char*, const cairn::safetensors_strategy*> st_strategies[] = {
        {"one_file", &s.one_file}, {"per_tensor", &s.per_tensor}, {"chunks", &s.chunks}};
    for (const auto& [name, strategy] : st_strategies) {
      cairn::save_options so;
      so.strategy = strategy;
      so.block_size = 96;  // the shards every rank writes first are tiled
      w.push_back(save_writer(name, "safetensors", false, safetensors_file, so,
                              exercised_by(cv::parse_output_format(name).value())));
    }
    cairn::save_options source_so;
    source_so.block_size = 128;
    for (cv::output_format f :
         {cv::output_format::native, cv::output_format::torch_dist, cv::output_format::one_file,
          cv::output_format::per_tensor, cv::output_format::chunks}) {
      cv::convert_options opt;
      opt.format = f;
      opt.slab_bytes = 48;  // several slabs per tensor, several tensors per slab
      opt.chunk_size = 300;
      w.push_back(
          convert_writer("convert:" + std::string(cv::format_name(f)), opt, false, source_so));
    }
    cv::convert_options dcp_1_13;
    dcp_1_13.format = cv::output_format::torch_dist;
    dcp_1_13.dcp_flavor = cairn::dcp::flavor::torch1_13;
    dcp_1_13.slab_bytes = 48;
    w.push_back(convert_writer("convert:torch_dist(torch 1.13)", dcp_1_13, false, source_so));
    w.back().cannot_hold = torch_1_13_lacks;
    cv::convert_options per_tensor;
    per_tensor.format = cv::output_format::per_tensor;
    per_tensor.slab_bytes = 100;
    w.push_back(convert_writer("unshard:per_tensor", per_tensor, true, source_so));
    cairn::save_options dcp_source = source_so;  // unshard reading a DCP checkpoint
    dcp_source.strategy = &s.torch_dist;
    cv::convert_options chunks;
    chunks.format = cv::output_format::chunks;
    chunks.slab_bytes = 64;
    chunks.chunk_size = 200;
    w.push_back(convert_writer("unshard:chunks(from torch_dist)", chunks, true, dcp_source));
    for (const format_row& row : format_rows())
      for (writer& fw : format_writers(row)) w.push_back(std::move(fw));
    return w;
  }();
  return all;
}

/// What a reader found wrong with one writer's output (empty: every byte as expected).
using failures = std::vector<std::string>;

/// What a reader is: a name and a read of the state `c` back from a checkpoint.
struct reader {
  std::string name;
  /// Reads `c` from `st` (written by `w`), on `m` ranks where it runs on several; random boxes
  /// come from `rng`. Returns what differs from the expected contents.
  std::function<failures(
      const writer& w, cairn::memory_storage& st, const property_case& c, int m, std::mt19937& rng)>
      read;
};

/// The expected bytes of `region` of tensor `s` (row-major).
inline std::vector<std::byte> expected(const tensor_spec& s, const cairn::box& region) {
  std::vector<std::byte> b(static_cast<std::size_t>(region.volume()) * cairn::dtype_size(s.type));
  fill_block(s.key, s.type, s.global, region, b.data());
  return b;
}

/// The whole box of a shape.
inline cairn::box whole(const cairn::shape& dims) { return {cairn::shape(dims.size(), 0), dims}; }

/// A random box inside `dims` (possibly empty along an axis).
inline cairn::box random_box(std::mt19937& rng, const cairn::shape& dims) {
  cairn::box b = whole(dims);
  for (std::size_t a = 0; a < dims.size(); ++a) {
    b.offset[a] = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(dims[a] + 1));
    b.size[a] =
        static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(dims[a] - b.offset[a] + 1));
  }
  return b;
}

/// `what` as a failure line naming the tensor.
inline std::string failure(const std::string& key, const std::string& what) {
  return key + ": " + what;
}

/// `load` on `m` thread ranks, each rank's shards laid out as `kind`, with `lo`.
inline reader load_reader(std::string name, layout_kind kind, cairn::load_options lo = {}) {
  return {std::move(name),
          [kind, lo](const writer&, cairn::memory_storage& st, const property_case& c, int m,
                     std::mt19937&) { return load_failures_on_threads(st, c, m, kind, lo); }};
}

/// Load options that read every piece all ranks ask for alike once and broadcast it, however
/// small (tensors whose load grid has one cell, 0-d tensors).
inline cairn::load_options broadcast_everything() {
  cairn::load_options lo;
  lo.read_once_broadcast = true;
  lo.broadcast_min_bytes = 0;
  return lo;
}

/// `open_source` lists every tensor with its dtype and shape; `read_box` of each whole tensor.
inline failures read_whole_boxes(
    const writer&, cairn::memory_storage& st, const property_case& c, int, std::mt19937&) {
  failures f;
  auto src = cv::open_source(st);
  if (!src) return {"open_source: " + src.err().describe()};
  if ((*src)->tensors().size() != c.specs.size())
    f.push_back("open_source lists " + std::to_string((*src)->tensors().size()) + " tensors");
  for (const auto& s : c.specs) {
    const cv::tensor_entry* t = (*src)->find(s.key);
    if (!t) {
      f.push_back(failure(s.key, "not listed"));
      continue;
    }
    if (t->type != s.type || t->global_shape != s.global) {
      f.push_back(failure(s.key, "listed as " + std::string(cairn::dtype_name(t->type)) + " " +
                                     whole(t->global_shape).str()));
      continue;
    }
    std::vector<std::byte> got(static_cast<std::size_t>(t->nbytes()));
    if (auto r = (*src)->read_box(s.key, whole(s.global), got); !r)
      f.push_back(failure(s.key, r.err().describe()));
    else if (got != expected(s, whole(s.global)))
      f.push_back(failure(s.key, "whole tensor differs"));
  }
  return f;
}

/// `open_source` then random boxes of every tensor, all in one batched `read` (two boxes of a
/// tensor included), then one by one with `read_box`.
inline failures read_random_boxes(
    const writer&, cairn::memory_storage& st, const property_case& c, int, std::mt19937& rng) {
  failures f;
  auto src = cv::open_source(st);
  if (!src) return {"open_source: " + src.err().describe()};
  std::vector<std::pair<const tensor_spec*, cairn::box>> boxes;
  for (const auto& s : c.specs)
    for (int k = 0; k < 3; ++k) boxes.emplace_back(&s, random_box(rng, s.global));
  std::vector<std::vector<std::byte>> got(boxes.size());
  std::vector<cv::box_read> batch;
  for (std::size_t i = 0; i < boxes.size(); ++i) {
    got[i].assign(static_cast<std::size_t>(boxes[i].second.volume()) *
                      cairn::dtype_size(boxes[i].first->type),
                  std::byte{0x77});
    batch.push_back({boxes[i].first->key, boxes[i].second, got[i]});
  }
  if (auto r = (*src)->read(batch); !r) return {"batched read: " + r.err().describe()};
  for (std::size_t i = 0; i < boxes.size(); ++i) {
    const auto& [s, b] = boxes[i];
    if (got[i] != expected(*s, b)) f.push_back(failure(s->key, "batched box " + b.str()));
    std::vector<std::byte> one(got[i].size(), std::byte{0x33});
    if (auto r = (*src)->read_box(s->key, b, one); !r)
      f.push_back(failure(s->key, "box " + b.str() + ": " + r.err().describe()));
    else if (one != expected(*s, b))
      f.push_back(failure(s->key, "box " + b.str()));
  }
  return f;
}

/// `read_any_metadata`: the writer's format name, every tensor with its dtype and shape, chunks
/// that tile each tensor exactly, and checksums exactly when the writer writes them.
inline failures read_metadata_of(
    const writer& w, cairn::memory_storage& st, const property_case& c, int, std::mt19937&) {
  failures f;
  auto fmt = cairn::detect_format(st);
  if (!fmt || *fmt != w.format)
    f.push_back("detect_format says " + (fmt ? *fmt : fmt.err().describe()));
  auto m = cairn::read_any_metadata(st);
  if (!m) return {"read_any_metadata: " + m.err().describe()};
  if (m->format != w.format) f.push_back("read_any_metadata says format " + m->format);
  if (m->verified() != w.checksummed)
    f.push_back(std::string("read_any_metadata says verified ") + (m->verified() ? "yes" : "no"));
  if (m->tensors.size() != c.specs.size())
    f.push_back("read_any_metadata lists " + std::to_string(m->tensors.size()) + " tensors");
  for (const auto& s : c.specs) {
    auto it = m->tensors.find(s.key);
    if (it == m->tensors.end()) {
      f.push_back(failure(s.key, "not in the metadata"));
      continue;
    }
    const cairn::tensor_record& t = it->second;
    if (t.type != s.type || t.global_shape != s.global)
      f.push_back(failure(s.key, "metadata says " + std::string(cairn::dtype_name(t.type)) + " " +
                                     whole(t.global_shape).str()));
    std::vector<cairn::box> regions;
    for (const auto& ch : t.chunks) regions.push_back(ch.region);
    if (auto p = cairn::check_exact_cover(regions, whole(s.global)))
      f.push_back(failure(s.key, "chunks do not tile the tensor exactly"));
  }
  return f;
}

/// What is wrong with `all`, every tensor of `c` whole as `what` returned them.
inline failures compare_whole(const std::string& what,
                              const std::map<std::string, cairn::tensor_data>& all,
                              const property_case& c) {
  failures f;
  if (all.size() != c.specs.size())
    f.push_back(what + " returns " + std::to_string(all.size()) + " tensors");
  for (const auto& s : c.specs) {
    auto it = all.find(s.key);
    if (it == all.end())
      f.push_back(failure(s.key, "not returned"));
    else if (it->second.type != s.type || it->second.global_shape != s.global ||
             it->second.data != expected(s, whole(s.global)))
      f.push_back(failure(s.key, what + " differs"));
  }
  return f;
}

/// `load_tensors`: every tensor whole, on one process.
inline failures read_load_tensors(
    const writer&, cairn::memory_storage& st, const property_case& c, int, std::mt19937&) {
  auto all = cairn::load_tensors(st);
  if (!all) return {"load_tensors: " + all.err().describe()};
  return compare_whole("load_tensors", *all, c);
}

/// `consolidate`: every tensor whole in memory, from `open_source`.
inline failures read_consolidated(
    const writer&, cairn::memory_storage& st, const property_case& c, int, std::mt19937&) {
  auto src = cv::open_source(st);
  if (!src) return {"open_source: " + src.err().describe()};
  auto all = cv::consolidate(**src);
  if (!all) return {"consolidate: " + all.err().describe()};
  return compare_whole("consolidate", *all, c);
}

/// `verify_checkpoint`: recomputes every checksum of a checksummed output and finds nothing
/// wrong. An output without checksums is never passed as verified: verify fails saying it is
/// not a cairn checkpoint (or naming its layout), and does not call it corrupt.
inline failures verify(
    const writer& w, cairn::memory_storage& st, const property_case&, int, std::mt19937&) {
  auto problems = cairn::verify_checkpoint(st);
  if (!w.checksummed) {
    if (problems) return {"verify_checkpoint passes an output it has no checksums for"};
    const std::string said = problems.err().describe();
    if (problems.err().code == cairn::errc::corrupt)
      return {"verify_checkpoint calls a good " + w.format + " checkpoint corrupt: " + said};
    if (said.find("not a cairn checkpoint") == std::string::npos &&
        said.find(w.format) == std::string::npos)
      return {"verify_checkpoint does not say what it cannot check: " + said};
    return {};
  }
  if (!problems) return {"verify_checkpoint: " + problems.err().describe()};
  failures f;
  for (const auto& p : *problems) f.push_back(p.item + ": " + p.err.describe());
  return f;
}

/// Every reader.
inline const std::vector<reader>& readers() {
  static const std::vector<reader> all = {
      load_reader("load/block", layout_kind::block),
      load_reader("load/flattened", layout_kind::flattened),
      load_reader("load/per-layer", layout_kind::prepended),
      load_reader("load/block, read once and broadcast", layout_kind::block,
                  broadcast_everything()),
      {"open_source/whole", read_whole_boxes},
      {"open_source/random boxes", read_random_boxes},
      {"consolidate", read_consolidated},
      {"read_any_metadata", read_metadata_of},
      {"load_tensors", read_load_tensors},
      {"verify_checkpoint", verify},
  };
  return all;
}

/// The name of the determinism check in `known_gaps()`.
inline const std::string same_bytes_check = "same bytes on every run";

/// The name of the refusal check (of `writer::cannot_hold`) in `known_gaps()`.
inline const std::string refuses_check = "refuses what it cannot hold";

/// A check (a reader, `same_bytes_check` or `refuses_check`) that fails on a writer's output today,
/// for a reason in the library. The suite checks that it still fails (when `always`: it fails on
/// every run; a gap that shows only under some thread timings is skipped, with a message), so
/// that a fix shows up as a failure asking to remove the entry.
struct known_gap {
  std::string check;
  std::string subject;  ///< a writer's name, or a format (every writer of that format)
  std::string why;
  bool always = true;
};

/// Every known gap.
inline const std::vector<known_gap>& known_gaps() {
  static const std::vector<known_gap> all = {
      {"verify_checkpoint", "torch_dist",
       "verify_checkpoint parses Megatron's metadata.json as cairn's and reports a good DCP "
       "checkpoint as 'corrupt: malformed metadata' instead of saying it has no checksums"},
  };
  return all;
}

/// The known gap of `check` on writer `w`'s output, or nullptr.
inline const known_gap* gap_of(const std::string& check, const writer& w) {
  for (const auto& g : known_gaps())
    if (g.check == check && (g.subject == w.name || g.subject == w.format)) return &g;
  return nullptr;
}

}  // namespace cairn_test::conformance
