// cairn/storage/fault_injection-inl.hpp: the bodies of cairn/storage/fault_injection.hpp (included
// by it when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include "cairn/storage/fault_injection.hpp"

namespace cairn::detail {

CAIRN_INLINE bool fault_state::read_fails(std::string_view name) {
  if (!has_failing_reads.load(std::memory_order_relaxed)) return false;
  std::lock_guard lock(mu);
  return failing_reads.find(name) != failing_reads.end();
}

CAIRN_INLINE std::optional<fault_mode> fault_state::next_op(std::string_view what,
                                                            std::string_view file) {
  std::uint64_t k = ops.fetch_add(1, std::memory_order_relaxed);
  if (k != fault_at.load(std::memory_order_relaxed)) return std::nullopt;
  fired.store(true);
  std::lock_guard lock(mu);
  fired_at = std::string(what) + " " + std::string(file);
  return mode.load();
}

CAIRN_INLINE error injected(std::string what, std::string file) {
  error e = make_error(errc::io, "injected failure: " + what + " " + file);
  e.file = std::move(file);
  return e;
}

CAIRN_INLINE result<void> faulty_writer::write_at(std::uint64_t offset,
                                                  std::span<const std::byte> data) {
  auto fault = state_->next_op("write_at", file_);
  if (state_->write_fails() || fault == fault_mode::fail) {
    error e = injected("write_at", file_);
    e.offset = offset;
    return e;
  }
  if (fault == fault_mode::fail_partial || fault == fault_mode::lie_partial) {
    auto half = first_half(data);
    if (!half.empty()) CAIRN_TRY(inner_->write_at(offset, half));
    if (fault == fault_mode::lie_partial) return ok();
    error e = injected(
        "write_at (no space left on device after " + std::to_string(half.size()) + " bytes)",
        file_);
    e.offset = offset + half.size();
    return e;
  }
  state_->writes.fetch_add(1, std::memory_order_relaxed);
  CAIRN_TRY(inner_->write_at(offset, data));
  state_->bytes_written.fetch_add(data.size(), std::memory_order_relaxed);
  if (fault == fault_mode::lost_ack) return injected("write_at (acknowledgement lost)", file_);
  return ok();
}

CAIRN_INLINE result<void> faulty_writer::finish() {
  auto fault = state_->next_op("finish", file_);
  if (state_->fail_finish.load(std::memory_order_relaxed) || fault == fault_mode::fail ||
      fault == fault_mode::fail_partial)
    return injected("finish", file_);
  if (fault == fault_mode::lie_partial) return ok();  // never finished
  CAIRN_TRY(inner_->finish());
  if (fault == fault_mode::lost_ack) return injected("finish (acknowledgement lost)", file_);
  return ok();
}

}  // namespace cairn::detail
