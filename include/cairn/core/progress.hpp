// cairn/core/progress.hpp: progress reports of long operations (save, load, verify, convert,
// downloads), and the meter that counts bytes and calls the user's callback.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string_view>

#include "cairn/detail/config.hpp"

namespace cairn {

/// One report of how far a long operation has come on this rank, handed to a
/// `progress_callback`. Within one stage `done` never decreases and ends at `total` when the
/// stage succeeds.
struct progress_report {
  /// What is being done: "write" (a save's data, this rank's share), "assemble" (the
  /// safetensors strategies' second pass), "read" (a load's tensor data), "verify", "convert"
  /// (`convert`, `unshard`), "diff" (`convert::diff`, bytes per side), "download"
  /// (`cached_storage`, one object at a time).
  std::string_view stage;
  std::uint64_t done = 0;   ///< bytes of the stage done so far
  std::uint64_t total = 0;  ///< bytes the stage handles on this rank (never 0: see below)
  /// The object a "download" fetches; empty for the other stages.
  std::string_view object;
};

/// Called as an operation makes progress. A stage with nothing to do on this rank reports
/// nothing; one that does reports once at its start (`done` 0), about every 1/1000 of `total`
/// and at its end (`done == total`). Calls come one at a time, from whichever thread made the
/// progress (a save's or load's I/O threads, an async save's background thread): keep the
/// callback short, and it must not throw.
using progress_callback = std::function<void(const progress_report&)>;

namespace detail {

/// Counts the bytes a stage has done and reports them to a callback: at the start, whenever
/// another 1/1000 of the total is done, and at the end. Thread-safe; calls the callback under
/// its lock, so one call at a time. Does nothing when the callback is empty or the total 0.
class progress_meter {
 public:
  /// A meter of `total` bytes of `stage` (a string literal), reporting to `callback` (may be
  /// null or empty), for `object` when given (it must outlive the meter).
  progress_meter(const progress_callback* callback,
                 std::string_view stage,
                 std::uint64_t total,
                 std::string_view object = {});
  progress_meter(const progress_meter&) = delete;
  progress_meter& operator=(const progress_meter&) = delete;

  /// Adds `n` bytes done (a sum past the total is reported as the total).
  void add(std::uint64_t n);
  /// Reports the end (`done == total`) unless that was reported already: for a stage whose
  /// counted bytes fell short of its estimate.
  void finish();

 private:
  const progress_callback* callback_;
  std::string_view stage_, object_;
  std::uint64_t total_, step_;
  std::mutex mu_;
  std::uint64_t done_ = 0, next_ = 0;
};

}  // namespace detail

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/core/progress-inl.hpp"
#endif
