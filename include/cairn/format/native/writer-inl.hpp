// cairn/format/native/writer-inl.hpp: the bodies of cairn/format/native/writer.hpp (included by it
// when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

#include "cairn/detail/parallel.hpp"
#include "cairn/format/commit.hpp"
#include "cairn/format/native/writer.hpp"
#include "cairn/plan/box.hpp"

namespace cairn::detail {

CAIRN_INLINE std::vector<write_task> plan_write_tasks(std::vector<write_item>& items,
                                                      std::vector<std::vector<box>>& tiles,
                                                      std::uint64_t block_size,
                                                      std::uint64_t gather_bytes,
                                                      bool compress) {
  // Compressed runs are buffered, so they are kept to about one gather buffer.
  const std::uint64_t io = compress ? gather_bytes : max_io_bytes;
  const std::uint64_t step = std::max<std::uint64_t>(block_size, io / block_size * block_size);
  std::vector<write_task> tasks;
  tiles.assign(items.size(), {});
  for (std::size_t i = 0; i < items.size(); ++i) {
    write_item& it = items[i];
    const bool compressed_item = compress && !it.is_object;
    if (it.tiles.empty()) {
      it.checksums.assign((it.nbytes + block_size - 1) / block_size, 0);
      if (compress && it.is_object)  // one contiguous run
        tasks.push_back({i, 0, it.nbytes});
      else
        for (std::uint64_t b = 0; b < it.nbytes; b += step)
          tasks.push_back({i, b, std::min(it.nbytes, b + step)});
    } else {
      for_each_tile(it.region, it.tiles, [&](const box& t) { tiles[i].push_back(t); });
      it.checksums.assign(tiles[i].size(), 0);
    }
    it.block_offsets.assign(compressed_item ? it.checksums.size() : 0, 0);
    it.block_stored.assign(compressed_item ? it.checksums.size() : 0, 0);
    if (it.tiles.empty()) continue;
    std::uint64_t pos = 0;
    write_task cur{i, 0, 0, 0, 0};
    for (std::size_t k = 0; k < tiles[i].size(); ++k) {
      std::uint64_t n = static_cast<std::uint64_t>(tiles[i][k].volume()) * it.elem_size;
      if (cur.last_tile > cur.first_tile && cur.end - cur.begin + n > gather_bytes) {
        tasks.push_back(cur);
        cur = write_task{i, pos, pos, k, k};
      }
      pos += n;
      cur.end = pos;
      cur.last_tile = k + 1;
    }
    if (cur.last_tile > cur.first_tile) tasks.push_back(cur);
  }
  return tasks;
}

template <class At, class Len>
result<void> block_sink::blocks(
    write_item& it, std::size_t first, std::size_t n, At&& at, Len&& len, turn& t) {
  std::unique_ptr<std::byte[]> out(new std::byte[n * ZSTD_compressBound(block_size_)]);
  std::unique_ptr<ZSTD_CCtx, std::size_t (*)(ZSTD_CCtx*)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
  std::uint64_t used = 0;
  for (std::size_t q = 0; q < n; ++q) {
    const std::byte* src = at(q);
    std::uint64_t l = len(q);
    std::size_t c =
        ZSTD_compressCCtx(cctx.get(), out.get() + used, ZSTD_compressBound(l), src, l, zstd_level_);
    if (ZSTD_isError(c))
      return make_error(errc::io, std::string("zstd: ") + ZSTD_getErrorName(c)).with_key(it.key);
    if (c >= l) {
      std::memcpy(out.get() + used, src, l);
      c = l;
    }
    it.block_stored[first + q] = c;
    used += c;
  }
  std::uint64_t pos = t.reserve(used);
  for (std::size_t q = 0; q < n; ++q) {
    it.block_offsets[first + q] = pos;
    pos += it.block_stored[first + q];
  }
  return out_.write_at(pos - used, {out.get(), static_cast<std::size_t>(used)});
}

CAIRN_INLINE block_sink::turn::~turn() {
  if (!taken_ && sink_.compressed()) sink_.reserve(ticket_, 0);
}

CAIRN_INLINE std::uint64_t block_sink::turn::reserve(std::uint64_t n) {
  taken_ = true;
  return sink_.reserve(ticket_, n);
}

CAIRN_INLINE std::uint64_t block_sink::end() const {
  std::lock_guard lock(mu_);
  return end_;
}

CAIRN_INLINE result<void> block_sink::raw(write_item& it,
                                          std::uint64_t at,
                                          std::span<const std::byte> data,
                                          turn& t) {
  if (compressed() && it.is_object) {
    it.file_offset = t.reserve(it.nbytes);
    return out_.write_at(it.file_offset, data);
  }
  return out_.write_at(it.file_offset + at, data);
}

CAIRN_INLINE std::uint64_t block_sink::reserve(std::size_t ticket, std::uint64_t n) {
  std::unique_lock lock(mu_);
  turn_cv_.wait(lock, [&] { return next_ticket_ == ticket; });
  std::uint64_t pos = end_;
  end_ += n;
  ++next_ticket_;
  turn_cv_.notify_all();
  return pos;
}

CAIRN_INLINE result<void> write_plain_task(const write_task& t,
                                           write_item& it,
                                           std::uint64_t block_size,
                                           block_sink& sink,
                                           block_sink::turn& turn) {
  for (std::uint64_t b = t.begin; b < t.end; b += block_size)
    it.checksums[b / block_size] =
        checksum({it.src + b, static_cast<std::size_t>(std::min(block_size, it.nbytes - b))});
  if (!sink.compressed() || it.is_object)
    return sink.raw(it, t.begin, {it.src + t.begin, static_cast<std::size_t>(t.end - t.begin)},
                    turn);
  std::size_t first = static_cast<std::size_t>(t.begin / block_size);
  std::size_t n = static_cast<std::size_t>((t.end - t.begin + block_size - 1) / block_size);
  return sink.blocks(
      it, first, n, [&](std::size_t q) { return it.src + t.begin + q * block_size; },
      [&](std::size_t q) { return std::min(block_size, t.end - t.begin - q * block_size); }, turn);
}

CAIRN_INLINE result<void> write_tiled_task(const write_task& t,
                                           write_item& it,
                                           const std::vector<box>& tiles,
                                           buffer_pool& buffers,
                                           block_sink& sink,
                                           block_sink::turn& turn) {
  std::unique_ptr<std::byte[]> buf = buffers.take();
  std::uint64_t off = 0;
  const std::size_t es = it.elem_size;
  std::vector<std::uint64_t> starts;
  for (std::size_t j = t.first_tile; j < t.last_tile; ++j) {
    const box& tile = tiles[j];
    std::byte* dst = buf.get() + off;
    for_each_run(it.region, tile, tile, [&](std::int64_t s, std::int64_t d, std::int64_t n) {
      std::memcpy(dst + static_cast<std::uint64_t>(d) * es,
                  it.src + static_cast<std::uint64_t>(s) * es, static_cast<std::size_t>(n) * es);
    });
    std::uint64_t n = static_cast<std::uint64_t>(tile.volume()) * es;
    it.checksums[j] = checksum({dst, static_cast<std::size_t>(n)});
    starts.push_back(off);
    off += n;
  }
  const std::size_t n = t.last_tile - t.first_tile;
  result<void> w =
      sink.compressed()
          ? sink.blocks(
                it, t.first_tile, n, [&](std::size_t q) { return buf.get() + starts[q]; },
                [&](std::size_t q) { return (q + 1 < n ? starts[q + 1] : off) - starts[q]; }, turn)
          : sink.raw(it, t.begin, {buf.get(), static_cast<std::size_t>(off)}, turn);
  buffers.give(std::move(buf));
  return w;
}

CAIRN_INLINE result<void> finish_object(storage_ref st,
                                        const std::string& name,
                                        object_writer& writer,
                                        std::uint64_t expected) {
  if (auto f = writer.finish(); !f) return std::move(f).err().with_file(st.describe(name));
  auto held = st.size(name);
  if (!held) return std::move(held).err().with_file(st.describe(name));
  if (*held != expected)
    return make_error(errc::io, "storage holds " + std::to_string(*held) + " bytes after " +
                                    std::to_string(expected) + " were written and reported done")
        .with_file(st.describe(name));
  return ok();
}

CAIRN_INLINE result<void> write_items(storage_ref st,
                                      const std::string& name,
                                      std::vector<write_item>& items,
                                      std::uint64_t block_size,
                                      int threads,
                                      buffer_pool* buffers,
                                      int zstd_level,
                                      std::uint64_t* file_size,
                                      progress_meter* progress) {
  std::optional<buffer_pool> own;
  if (!buffers || buffers->size() < block_size)
    buffers = &own.emplace(std::max<std::size_t>(std::size_t{8} << 20, block_size));
  std::vector<std::vector<box>> tiles;
  const std::vector<write_task> tasks =
      plan_write_tasks(items, tiles, block_size, buffers->size(), zstd_level > 0);
  CAIRN_TRY_ASSIGN(auto writer, st.open_writer(name));
  block_sink sink(*writer, block_size, zstd_level);
  auto r = run_parallel(tasks.size(), threads, [&](std::size_t k) -> result<void> {
    const write_task& t = tasks[k];
    write_item& it = items[t.item];
    block_sink::turn turn(sink, k);  // tasks start in index order (run_parallel)
    auto w = it.tiles.empty() ? write_plain_task(t, it, block_size, sink, turn)
                              : write_tiled_task(t, it, tiles[t.item], *buffers, sink, turn);
    if (!w) return std::move(w).err().with_key(it.key);
    if (progress) progress->add(t.end - t.begin);
    return ok();
  });
  if (!r) return std::move(r).err().with_file(st.describe(name));
  std::uint64_t expected = sink.end();
  if (!sink.compressed())
    for (const auto& it : items) expected = std::max(expected, it.file_offset + it.nbytes);
  CAIRN_TRY(finish_object(st, name, *writer, expected));
  if (sink.compressed()) {
    for (auto& it : items) {
      if (!it.block_offsets.empty())
        it.file_offset = it.block_offsets.front();
      else if (it.nbytes == 0)
        it.file_offset = 0;
    }
  }
  if (file_size) *file_size = sink.end();
  return ok();
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE void add_common_state(checkpoint_metadata& m, common_state cs) {
  cs.where.file = static_cast<std::uint32_t>(m.files.size());
  m.files.push_back(file_record{cs.name, 0, cs.where.nbytes, file_role::common});
  m.common = std::move(cs.where);
  m.commons = std::move(cs.records);
}

CAIRN_INLINE result<void> put_metadata(storage_ref st, const checkpoint_metadata& m) {
  std::string json = to_json(m);
  CAIRN_TRY(metadata_from_json(json, st.describe(metadata_name)));
  return put_checked(st, metadata_name, std::as_bytes(std::span(json)));
}

}  // namespace cairn

namespace cairn::detail {

CAIRN_INLINE void remove_unreferenced(storage_ref st, const checkpoint_metadata& m) {
  auto names = st.list("");
  if (!names) return;
  for (const auto& n : *names) {
    bool ours =
        n.find('/') == std::string::npos &&
        (n.rfind("data.", 0) == 0 || n.rfind("common.", 0) == 0 || n.rfind("index.", 0) == 0) &&
        n.size() > 6 && n.substr(n.size() - 6) == ".cairn";
    if (!ours) continue;
    bool referenced = std::any_of(m.files.begin(), m.files.end(),
                                  [&](const file_record& f) { return f.name == n; });
    if (!referenced) (void)st.remove(n);
  }
}

}  // namespace cairn::detail
