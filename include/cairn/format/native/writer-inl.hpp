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
                                                      bool compress,
                                                      std::uint64_t device_piece) {
  // Compressed runs are buffered, so they are kept to about one gather buffer.
  const std::uint64_t io = compress ? gather_bytes : max_io_bytes;
  std::vector<write_task> tasks;
  tiles.assign(items.size(), {});
  for (std::size_t i = 0; i < items.size(); ++i) {
    write_item& it = items[i];
    const bool compressed_item = compress && !it.is_object;
    // An item in device memory is read one staging window slot per task.
    const std::uint64_t limit = it.on_device ? std::min(io, device_piece) : io;
    const std::uint64_t step = std::max<std::uint64_t>(block_size, limit / block_size * block_size);
    const std::uint64_t gather = it.on_device ? std::min(gather_bytes, device_piece) : gather_bytes;
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
      if (cur.last_tile > cur.first_tile && cur.end - cur.begin + n > gather) {
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
                                           const std::byte* data,
                                           std::uint64_t block_size,
                                           block_sink& sink,
                                           block_sink::turn& turn) {
  const std::uint64_t len = t.end - t.begin;
  for (std::uint64_t b = 0; b < len; b += block_size)
    it.checksums[(t.begin + b) / block_size] =
        checksum({data + b, static_cast<std::size_t>(std::min(block_size, len - b))});
  if (!sink.compressed() || it.is_object)
    return sink.raw(it, t.begin, {data, static_cast<std::size_t>(len)}, turn);
  std::size_t first = static_cast<std::size_t>(t.begin / block_size);
  std::size_t n = static_cast<std::size_t>((len + block_size - 1) / block_size);
  return sink.blocks(
      it, first, n, [&](std::size_t q) { return data + q * block_size; },
      [&](std::size_t q) { return std::min(block_size, len - q * block_size); }, turn);
}

/// Gathers the tiles `t` covers, one after another, out of item `it` (row-major over its
/// region) through `copy_run(dst_offset, src_offset, bytes)`: runs are merged while both sides
/// stay contiguous. Returns where each tile starts in the gathered bytes.
template <class CopyRun>
result<std::vector<std::uint64_t>> gather_tiles(const write_task& t,
                                                const write_item& it,
                                                const std::vector<box>& tiles,
                                                CopyRun&& copy_run) {
  const std::size_t es = it.elem_size;
  std::vector<std::uint64_t> starts;
  std::uint64_t off = 0;
  std::uint64_t run_src = 0, run_dst = 0, run_len = 0;
  auto flush = [&]() -> result<void> {
    if (run_len == 0) return ok();
    auto c = copy_run(run_dst, run_src, run_len);
    run_len = 0;
    return c;
  };
  for (std::size_t j = t.first_tile; j < t.last_tile; ++j) {
    const box& tile = tiles[j];
    result<void> copied = ok();
    for_each_run(it.region, tile, tile, [&](std::int64_t s, std::int64_t d, std::int64_t n) {
      if (!copied) return;
      const std::uint64_t src = static_cast<std::uint64_t>(s) * es;
      const std::uint64_t dst = off + static_cast<std::uint64_t>(d) * es;
      const std::uint64_t len = static_cast<std::uint64_t>(n) * es;
      if (run_len > 0 && run_src + run_len == src && run_dst + run_len == dst) {
        run_len += len;
        return;
      }
      copied = flush();
      run_src = src;
      run_dst = dst;
      run_len = len;
    });
    CAIRN_TRY(std::move(copied));
    starts.push_back(off);
    off += static_cast<std::uint64_t>(tile.volume()) * es;
  }
  CAIRN_TRY(flush());
  return starts;
}

CAIRN_INLINE result<void> write_tiled_task(const write_task& t,
                                           write_item& it,
                                           const std::byte* data,
                                           const std::vector<std::uint64_t>& starts,
                                           block_sink& sink,
                                           block_sink::turn& turn) {
  const std::size_t n = t.last_tile - t.first_tile;
  const std::uint64_t total = t.end - t.begin;
  auto end_of = [&](std::size_t q) { return q + 1 < n ? starts[q + 1] : total; };
  for (std::size_t q = 0; q < n; ++q)
    it.checksums[t.first_tile + q] =
        checksum({data + starts[q], static_cast<std::size_t>(end_of(q) - starts[q])});
  if (!sink.compressed())
    return sink.raw(it, t.begin, {data, static_cast<std::size_t>(total)}, turn);
  return sink.blocks(
      it, t.first_tile, n, [&](std::size_t q) { return data + starts[q]; },
      [&](std::size_t q) { return end_of(q) - starts[q]; }, turn);
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
                                      progress_meter* progress,
                                      cuda::staging_window* window) {
  std::optional<buffer_pool> own;
  if (!buffers || buffers->size() < block_size)
    buffers = &own.emplace(std::max<std::size_t>(std::size_t{8} << 20, block_size));
  for (const auto& it : items)
    if (it.on_device && (!window || window->piece_bytes() < block_size))
      return make_error(errc::invalid_argument,
                        window ? "the staging window's slots are smaller than one checksum block"
                               : "an item in device memory and no staging window to read it")
          .with_key(it.key);
  std::vector<std::vector<box>> tiles;
  const std::vector<write_task> tasks =
      plan_write_tasks(items, tiles, block_size, buffers->size(), zstd_level > 0,
                       window ? window->piece_bytes() : 0);
  CAIRN_TRY_ASSIGN(auto writer, st.open_writer(name));
  block_sink sink(*writer, block_size, zstd_level);
  auto run_task = [&](const write_task& t, write_item& it, block_sink::turn& turn) -> result<void> {
    if (it.on_device) {
      cuda::staging_window::slot slot = window->take();
      if (!it.tiles.empty()) {
        CAIRN_TRY_ASSIGN(auto starts,
                         gather_tiles(t, it, tiles[t.item],
                                      [&](std::uint64_t dst, std::uint64_t src, std::uint64_t n) {
                                        return slot.from_device(static_cast<std::size_t>(dst),
                                                                it.src + src,
                                                                static_cast<std::size_t>(n));
                                      }));
        CAIRN_TRY(slot.wait());
        return write_tiled_task(t, it, slot.bytes().data(), starts, sink, turn);
      }
      CAIRN_TRY(slot.from_device(0, it.src + t.begin, static_cast<std::size_t>(t.end - t.begin)));
      CAIRN_TRY(slot.wait());
      return write_plain_task(t, it, slot.bytes().data(), block_size, sink, turn);
    }
    if (it.tiles.empty()) return write_plain_task(t, it, it.src + t.begin, block_size, sink, turn);
    std::unique_ptr<std::byte[]> buf = buffers->take();
    auto starts = gather_tiles(
        t, it, tiles[t.item], [&](std::uint64_t dst, std::uint64_t src, std::uint64_t n) {
          std::memcpy(buf.get() + dst, it.src + src, static_cast<std::size_t>(n));
          return ok();
        });
    auto w = starts ? write_tiled_task(t, it, buf.get(), *starts, sink, turn)
                    : result<void>(std::move(starts).err());
    buffers->give(std::move(buf));
    return w;
  };
  // A thread holds at most one slot; no more threads than slots, so that none waits for a slot
  // while holding the append turn another needs (compressed).
  if (window) threads = std::max(1, std::min(threads, static_cast<int>(window->slots())));
  auto r = run_parallel(tasks.size(), threads, [&](std::size_t k) -> result<void> {
    const write_task& t = tasks[k];
    write_item& it = items[t.item];
    block_sink::turn turn(sink, k);  // tasks start in index order (run_parallel)
    auto w = run_task(t, it, turn);
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
