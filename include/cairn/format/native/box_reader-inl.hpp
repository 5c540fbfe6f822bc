// cairn/format/native/box_reader-inl.hpp: the bodies of cairn/format/native/box_reader.hpp
// (included by it when header-only; compiled once into cairn::compiled with
// CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

#include "cairn/detail/parallel.hpp"
#include "cairn/format/native/box_reader.hpp"
#include "cairn/format/native/reader.hpp"

namespace cairn::detail {

CAIRN_INLINE std::uint64_t read_length(const read_op& op, std::uint64_t block_size) {
  const std::uint64_t lo = op.first_block * block_size;
  return std::min(op.chunk->where.nbytes, (op.last_block + 1) * block_size) - lo;
}

CAIRN_INLINE result<void> cast_run(const copy_job& job,
                                   std::span<const std::byte> in,
                                   std::uint64_t at,
                                   std::byte* run_dst,
                                   std::vector<std::byte>& converted,
                                   std::optional<cuda::window_mover>& device) {
  const std::uint64_t es = job.elem_size, target_es = dtype_size(job.target_type);
  if (at % es != 0 || in.size() % es != 0)
    return make_error(errc::invalid_argument,
                      "cannot convert " + std::string(dtype_name(job.saved_type)) + " to " +
                          std::string(dtype_name(job.target_type)) +
                          ": the checkpoint's block size splits elements between reads")
        .with_key(job.key);
  const std::size_t count = in.size() / es;
  std::byte* dst = run_dst + at / es * target_es;
  std::span<std::byte> out{dst, static_cast<std::size_t>(count * target_es)};
  if (job.on_device) {
    converted.resize(out.size());
    out = converted;
  }
  convert_elements(job.saved_type, job.target_type, in, out);
  if (job.on_device) return device->put(dst, out.data(), out.size());
  return ok();
}

CAIRN_INLINE result<void> run_read(storage_ref st,
                                   const checkpoint_metadata& m,
                                   const std::vector<copy_job>& jobs,
                                   const read_op& op,
                                   const std::vector<std::size_t>& group,
                                   buffer_pool& pool,
                                   std::atomic<std::uint64_t>& bytes_read,
                                   progress_meter& progress,
                                   cuda::staging_window* window) {
  const extent& e = op.chunk->where;
  const std::uint64_t lo = op.first_block * m.block_size;
  const std::uint64_t len = read_length(op, m.block_size);
  std::unique_ptr<std::byte[]> temp;  // from the pool, not zeroed: every byte is read into
  std::span<std::byte> buf;
  if (op.direct) {
    buf = {op.direct, static_cast<std::size_t>(len)};
  } else {
    temp = pool.take();
    buf = {temp.get(), static_cast<std::size_t>(len)};
  }
  struct give_back {
    buffer_pool& pool;
    std::unique_ptr<std::byte[]>& b;
    ~give_back() {
      if (b) pool.give(std::move(b));
    }
  } returned{pool, temp};
  std::string what = "chunk " + op.chunk->region.str() + " of tensor";
  CAIRN_TRY(read_verified_blocks(st, m, e, op.first_block, op.last_block, buf,
                                 jobs[group.front()].key, what));
  bytes_read += len;
  progress.add(len);
  if (op.direct) return ok();
  std::optional<cuda::window_mover> device;  // for targets in device memory
  std::vector<std::byte> converted;          // a converted run on its way to the device
  result<void> moved = ok();
  for (std::size_t j : group) {
    const copy_job& job = jobs[j];
    if (job.on_device && !device) {
      if (!window)
        return make_error(errc::invalid_argument,
                          "a target in device memory and no staging window to copy it through")
            .with_key(job.key);
      device.emplace(*window);
    }
    const std::uint64_t es = job.elem_size;
    const std::uint64_t target_es = dtype_size(job.target_type);
    for_each_run(
        op.chunk->region, job.dst_box, job.region,
        [&](std::int64_t s, std::int64_t t, std::int64_t n) {
          std::uint64_t a = static_cast<std::uint64_t>(s) * es;
          std::uint64_t b = a + static_cast<std::uint64_t>(n) * es;
          std::uint64_t x = std::max(a, lo), y = std::min(b, lo + len);
          if (x >= y || !moved) return;
          std::span<const std::byte> in{buf.data() + (x - lo), static_cast<std::size_t>(y - x)};
          std::byte* dst = job.dst + static_cast<std::uint64_t>(t) * target_es;
          if (job.casts()) {
            moved = cast_run(job, in, x - a, dst, converted, device);
          } else if (job.on_device) {
            moved = device->put(dst + (x - a), in.data(), in.size());
          } else {
            std::memcpy(dst + (x - a), in.data(), in.size());
          }
        });
    if (!moved) return std::move(moved).err().with_key(job.key);
  }
  // The buffer goes back to the pool only once the device has its bytes.
  if (device) CAIRN_TRY(device->flush());
  return ok();
}

CAIRN_INLINE result<void> run_copies(storage_ref st,
                                     const checkpoint_metadata& m,
                                     const std::vector<copy_job>& jobs,
                                     int threads,
                                     read_counts& counts,
                                     buffer_pool* pool,
                                     const progress_callback* progress,
                                     cuda::staging_window* window) {
  std::optional<buffer_pool> own;
  if (!pool || pool->size() < m.block_size)
    pool = &own.emplace(std::max<std::size_t>(std::size_t{8} << 20, m.block_size));
  const read_plan plan = plan_reads(jobs, m.block_size, pool->size(), max_io_bytes);
  counts.bytes_needed += plan.bytes_needed;
  std::uint64_t total = 0;
  for (const read_op& op : plan.ops) total += read_length(op, m.block_size);
  progress_meter meter(progress, "read", total);
  std::atomic<std::uint64_t> bytes_read{0};
  auto r = run_parallel(plan.ops.size(), threads, [&](std::size_t k) -> result<void> {
    const read_op& op = plan.ops[k];
    return run_read(st, m, jobs, op, plan.job_groups[op.group], *pool, bytes_read, meter, window);
  });
  counts.bytes_read += bytes_read;
  return r;
}

}  // namespace cairn::detail

namespace cairn {

CAIRN_INLINE result<read_counts> read_boxes(storage_ref st,
                                            const checkpoint_metadata& m,
                                            const std::vector<box_request>& boxes,
                                            int threads,
                                            buffer_pool* pool,
                                            const progress_callback* progress) {
  std::vector<detail::copy_job> jobs;
  for (const box_request& b : boxes) {
    auto it = m.tensors.find(b.key);
    if (it == m.tensors.end())
      return make_error(errc::not_found, "tensor is not in the checkpoint")
          .with_key(b.key)
          .with_file(st.describe(""));
    const shape& global = it->second.global_shape;
    bool inside = b.region.offset.size() == global.size() && b.region.size.size() == global.size();
    for (std::size_t a = 0; inside && a < global.size(); ++a)
      inside = b.region.offset[a] >= 0 && b.region.size[a] >= 0 &&
               b.region.offset[a] <= global[a] &&
               b.region.size[a] <= global[a] - b.region.offset[a];
    if (!inside)
      return make_error(errc::invalid_argument, "box " + b.region.str() +
                                                    " does not lie inside the saved tensor " +
                                                    shape_str(global))
          .with_key(b.key);
    const std::uint64_t want =
        static_cast<std::uint64_t>(b.region.volume()) * dtype_size(it->second.type);
    if (b.out.size() != want)
      return make_error(errc::invalid_argument, "box " + b.region.str() + " needs " +
                                                    std::to_string(want) + " bytes, got " +
                                                    std::to_string(b.out.size()))
          .with_key(b.key);
    CAIRN_TRY(detail::plan_copies(it->second, b.key, b.region, b.out.data(), jobs));
  }
  read_counts counts;
  CAIRN_TRY(detail::run_copies(st, m, jobs, threads, counts, pool, progress));
  return counts;
}

}  // namespace cairn
