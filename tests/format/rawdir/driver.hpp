// tests/format/rawdir/driver.hpp: rawdir, a format that exists only in the tests, to show that a
// format plugs into cairn from its own folder and nothing else: this header registers its
// detection and reader (`register_format`), its save strategy (`register_save_strategy`) and its
// streaming writer (`stream::register_stream_writer`); the format conformance suite runs it as
// one row (conformance.hpp), and `cairn convert --format rawdir` writes it (the CLI test links
// this header into a copy of the tool). Nothing under include/ knows it. README.md beside it is
// its doc page.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/format/commit.hpp"
#include "cairn/format/detail/format_util.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/format/registry.hpp"
#include "cairn/format/save_strategy.hpp"
#include "cairn/format/stream/slab.hpp"
#include "cairn/format/stream/writers.hpp"
#include "cairn/format/writers.hpp"

namespace cairn_test::rawdir {

/// The format's id, and the name of its writers.
inline constexpr std::string_view id = "rawdir";
/// The catalog, written last: its presence commits a checkpoint.
inline constexpr std::string_view catalog_name = "rawdir.json";
/// The most bytes a catalog may claim before it is read (a larger one is corrupt).
inline constexpr std::uint64_t max_catalog_bytes = std::uint64_t{64} << 20;

/// The data file that rank `r` writes (a conversion writes rank 0's only).
inline std::string data_name(int r) { return "data." + std::to_string(r) + ".raw"; }

/// Whether `st` holds a rawdir checkpoint.
inline cairn::result<bool> detect(cairn::storage_ref st) { return st.exists(catalog_name); }

/// The catalog of the rawdir checkpoint on `st`: cairn's neutral catalog as JSON, read back
/// verbatim; a catalog of another layout, or larger than `max_catalog_bytes`, is corrupt.
inline cairn::result<cairn::checkpoint_metadata> read(cairn::storage_ref st) {
  CAIRN_TRY_ASSIGN(std::uint64_t n, st.size(catalog_name));
  if (n > max_catalog_bytes)
    return cairn::format_detail::corrupt("catalog of " + std::to_string(n) + " bytes (at most " +
                                             std::to_string(max_catalog_bytes) + ")",
                                         st.describe(catalog_name));
  CAIRN_TRY_ASSIGN(auto bytes, cairn::format_detail::read_bytes(st, catalog_name, 0, n));
  std::string_view json(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  CAIRN_TRY_ASSIGN(cairn::checkpoint_metadata m,
                   cairn::metadata_from_json(json, st.describe(catalog_name), true));
  if (m.format != id)
    return cairn::format_detail::corrupt("catalog of layout '" + m.format + "', not rawdir",
                                         st.describe(catalog_name));
  return m;
}

/// Puts `m` (chunks pointing into `m.files`) as the catalog, last.
inline cairn::result<void> put_catalog(cairn::storage_ref st, cairn::checkpoint_metadata m) {
  m.format = std::string(id);
  m.block_size = cairn::foreign_read_block;
  const std::string json = cairn::to_json(m);
  return cairn::put_checked(st, catalog_name, std::as_bytes(std::span(json.data(), json.size())));
}

/// The save strategy: each rank writes its planned chunks at their planned offsets of its data
/// file; rank 0 writes the catalog from the plan. Tensors only, never over a checkpoint.
class strategy final : public cairn::save_strategy {
 public:
  std::string_view name() const noexcept override { return id; }
  cairn::writer_features features(const cairn::save_options&) const noexcept override {
    cairn::writer_features f;
    f.can_overwrite = false;
    return f;
  }
  cairn::result<void> check(const cairn::leaf_list& leaves) const override {
    if (!leaves.objects.empty())
      return cairn::make_error(cairn::errc::invalid_argument, "rawdir holds tensors only")
          .with_key(leaves.objects.front().key);
    if (!leaves.commons.empty())
      return cairn::make_error(cairn::errc::invalid_argument, "rawdir holds tensors only")
          .with_key(leaves.commons.front().path);
    return cairn::ok();
  }
  cairn::result<void> write(cairn::planned_save& plan,
                            cairn::storage_ref st,
                            const cairn::save_options&,
                            cairn::buffer_pool*,
                            cairn::written_save&) const override {
    if (plan.items.empty()) return cairn::ok();
    const std::string name = data_name(plan.rank);
    CAIRN_TRY_ASSIGN(auto w, st.open_writer(name));
    for (const auto& item : plan.items) {
      auto r = w->write_at(item.file_offset, {item.src, static_cast<std::size_t>(item.nbytes)});
      if (!r) return std::move(r).err().with_key(item.key).with_file(st.describe(name));
      plan.stats.bytes_written += item.nbytes;
    }
    if (auto f = w->finish(); !f) return std::move(f).err().with_file(st.describe(name));
    return cairn::ok();
  }
  cairn::result<void> commit(cairn::planned_save& plan,
                             cairn::written_save&,
                             const std::vector<cairn::bytes>&,
                             const std::vector<cairn::bytes>&,
                             cairn::storage_ref st,
                             const cairn::save_options&) const override {
    cairn::checkpoint_metadata m;
    m.world_size = plan.index.world_size;
    std::vector<std::uint32_t> file_of(static_cast<std::size_t>(m.world_size), 0);
    for (int r = 0; r < m.world_size; ++r) {
      if (!plan.index.writes(r)) continue;
      file_of[static_cast<std::size_t>(r)] = static_cast<std::uint32_t>(m.files.size());
      m.files.push_back({data_name(r), r, plan.index.bytes_of_rank[static_cast<std::size_t>(r)]});
    }
    m.tensors = plan.index.tensors;
    for (auto& [k, t] : m.tensors)
      for (auto& c : t.chunks) c.where.file = file_of[c.where.file];
    return put_catalog(st, std::move(m));
  }
  void abandon(const cairn::planned_save& plan,
               const cairn::written_save&,
               cairn::storage_ref st) const override {
    (void)st.remove(data_name(plan.rank));
  }
  /// Never over a checkpoint: a catalog there is this save's.
  cairn::result<bool> committed(const cairn::planned_save&,
                                const cairn::written_save&,
                                cairn::storage_ref st) const override {
    return st.exists(catalog_name);
  }
};

/// The streaming writer: every tensor slab by slab into `data.0.raw`, a chunk per slab, then the
/// catalog. Tensors only (objects and common values are listed as skipped by `convert`).
inline cairn::result<void> stream_write(cairn::stream::source& src,
                                        cairn::storage_ref dst,
                                        const cairn::stream::write_job& job,
                                        cairn::stream::stream_stats& stats,
                                        cairn::detail::progress_meter* progress) {
  const std::string name = data_name(0);
  cairn::checkpoint_metadata m;
  std::vector<const cairn::stream::tensor_entry*> ts;
  for (const auto& t : src.tensors()) {
    ts.push_back(&t);
    m.tensors[t.key] = cairn::tensor_record{
        cairn::stream::output_dtype(t.type, job.settings.to_dtype), t.global_shape, {}};
  }
  CAIRN_TRY_ASSIGN(auto out, dst.open_writer(name));
  std::uint64_t off = 0;
  CAIRN_TRY(cairn::stream::detail::pump(
      src, cairn::stream::detail::plan_jobs(ts, job.settings), job.settings, stats, progress,
      [&](const cairn::stream::detail::slab_job& slab,
          std::span<const std::byte> bytes) -> cairn::result<void> {
        auto w = out->write_at(off, bytes);
        if (!w) return std::move(w).err().with_key(slab.t->key);
        m.tensors[slab.t->key].chunks.push_back(
            cairn::chunk_record{slab.region, cairn::extent{0, off, bytes.size(), {}}, {}});
        off += bytes.size();
        return cairn::ok();
      }));
  if (auto f = out->finish(); !f) return std::move(f).err().with_file(dst.describe(name));
  m.files.push_back({name, 0, off});
  stats.files.push_back(name);
  stats.tensors = ts.size();
  CAIRN_TRY(put_catalog(dst, std::move(m)));
  stats.files.emplace_back(catalog_name);
  return cairn::ok();
}

/// The one registration of the format: its driver, its save strategy, its streaming writer.
inline const bool registered =
    cairn::register_format(
        cairn::format_driver{std::string(id), 150, {std::string(catalog_name)}, &detect, &read}) &&
    cairn::register_save_strategy(
        std::string(id), [] { return std::unique_ptr<cairn::save_strategy>(new strategy); }) &&
    cairn::stream::register_stream_writer(
        {.name = std::string(id), .format = std::string(id), .write = &stream_write})
        .value();

}  // namespace cairn_test::rawdir
