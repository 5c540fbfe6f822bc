// cairn/storage/cached.hpp: cached_storage<S>, a pre-download decorator: the first read of an
// object downloads it whole into a local directory, and every read of it is then a local pread.
// For loads from object stores, where many small ranged reads cost a request each.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/core/progress.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/storage/decorator.hpp"
#include "cairn/storage/detail/posix.hpp"
#include "cairn/storage/file.hpp"
#include "cairn/storage/memory.hpp"
#include "cairn/storage/names.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn {

namespace detail {

/// One object of a cached_storage: downloaded once into `path`, then read from there.
struct cache_entry {
  /// Held by the download, and by a put, writer finish or remove of this name through the
  /// decorator, so that a download never mixes two versions of the object.
  std::mutex mu;
  std::atomic<bool> ready{false};  ///< downloaded whole into `path`
  std::atomic<bool> stale{false};  ///< the object changed through the decorator since
  std::string path;
  std::uint64_t size = 0;
};

/// The entries of a cached_storage, shared with the writers it hands out.
struct cache_state {
  std::filesystem::path dir;  ///< where this decorator's local copies live
  std::mutex mu;
  std::map<std::string, std::shared_ptr<cache_entry>, std::less<>> entries;
  std::atomic<std::uint64_t> downloads{0}, tmp_counter{0};
  /// Told each download's progress ("download"), one call at a time.
  progress_callback progress;

  /// The entry of `name`, created (not ready) when there is none.
  std::shared_ptr<cache_entry> entry(std::string_view name);

  /// Forgets `e`, the entry of `name`: later reads download again; its local copy is removed.
  void drop(std::string_view name, const std::shared_ptr<cache_entry>& e);

  /// Runs `change` (a put, finish or remove of `name` on the wrapped backend) while no download
  /// of `name` runs, then forgets the entry whatever the outcome (a failed call may still have
  /// changed the object).
  template <class F>
  auto changing(std::string_view name, F&& change) {
    auto e = entry(name);
    std::lock_guard lock(e->mu);
    auto r = change();
    drop(name, e);
    return r;
  }
};

/// Wraps a backend's writer: its finish() invalidates the cached copy of the object.
class cache_invalidating_writer final : public object_writer {
 public:
  cache_invalidating_writer(std::unique_ptr<object_writer> inner,
                            std::shared_ptr<cache_state> state,
                            std::string name)
      : inner_(std::move(inner)), state_(std::move(state)), name_(std::move(name)) {}
  result<void> write_at(std::uint64_t offset, std::span<const std::byte> data) override {
    return inner_->write_at(offset, data);
  }
  result<void> finish() override;

 private:
  std::unique_ptr<object_writer> inner_;
  std::shared_ptr<cache_state> state_;
  std::string name_;
};

/// A directory name no other cached_storage of any process uses at the same time:
/// "cairn-cache-<pid>-<n>".
CAIRN_INLINE std::string unique_cache_subdir();

}  // namespace detail

/// A pre-download decorator: the first `read` of an object downloads it whole (its `size`, then
/// reads of `chunk_bytes` each) into a file under a local directory, and every read of it is then
/// served from that file. `put`, writers' `finish()` and `remove` through the decorator go to the
/// backend and invalidate the local copy (a download never overlaps them, so it never mixes two
/// versions). Objects changed behind the decorator's back (by another process) are not seen
/// while it lives: use it for reading checkpoints that are complete. Every other call goes
/// straight to the backend; errors name the backend's objects (`describe` is the backend's).
///
/// ```
/// cairn::s3_storage s3{"s3://bucket/run/step_1000"};
/// cairn::cached_storage local{s3, "/local_nvme/cairn-cache"};
/// cairn::load(state, local, comm);   // each object this rank needs: one download
/// ```
///
/// Local copies live in `<dir>/cairn-cache-<pid>-<n>/<name>`, a directory of this decorator's
/// own (so decorators of different backends, or ranks, may share `dir`), removed with
/// everything in it when the decorator is destroyed. Downloads go to a temporary file renamed
/// into place. Movable, not copyable.
///
/// Thread-safe as the wrapped backend is. The referenced backend must outlive it.
template <storage S>
class cached_storage : public storage_decorator<S> {
  using storage_decorator<S>::inner_;

 public:
  /// Wraps `inner`, keeping local copies under `dir` (created when needed); downloads go in
  /// reads of `chunk_bytes`.
  cached_storage(S& inner,
                 std::filesystem::path dir,
                 std::size_t chunk_bytes = std::size_t{16} << 20)
      : storage_decorator<S>(inner),
        state_(std::make_shared<detail::cache_state>()),
        chunk_(chunk_bytes == 0 ? std::size_t{16} << 20 : chunk_bytes) {
    state_->dir = std::move(dir) / detail::unique_cache_subdir();
  }
  cached_storage(cached_storage&&) noexcept = default;
  cached_storage& operator=(cached_storage&&) = delete;
  cached_storage(const cached_storage&) = delete;
  cached_storage& operator=(const cached_storage&) = delete;
  /// Removes the local copies.
  ~cached_storage() {
    if (!state_) return;
    std::error_code ec;
    std::filesystem::remove_all(state_->dir, ec);
  }

  /// The directory of this decorator's local copies.
  const std::filesystem::path& directory() const noexcept { return state_->dir; }
  /// Objects downloaded so far.
  std::uint64_t downloads() const noexcept { return state_->downloads.load(); }
  /// Reports every download's bytes to `callback` (stage "download", the object's name in
  /// `object`), one call at a time even when several downloads run at once. Set it before
  /// the decorator is used.
  void set_progress(progress_callback callback) {
    state_->progress = {};
    if (!callback) return;
    auto mu = std::make_shared<std::mutex>();
    state_->progress = [mu, cb = std::move(callback)](const progress_report& r) {
      std::lock_guard lock(*mu);
      cb(r);
    };
  }

  result<void> put(std::string_view name, std::span<const std::byte> data) {
    return state_->changing(name, [&] { return inner_->put(name, data); });
  }
  result<std::unique_ptr<object_writer>> open_writer(std::string_view name) {
    CAIRN_TRY_ASSIGN(auto w, inner_->open_writer(name));
    return std::unique_ptr<object_writer>(std::make_unique<detail::cache_invalidating_writer>(
        std::move(w), state_, std::string(name)));
  }

  /// Fills `out` from the local copy of `name` (downloaded whole on first use); errc::corrupt
  /// "truncated" when the object is shorter, errc::not_found when it is missing.
  result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out) {
    CAIRN_TRY(check_object_name(name));
    auto e = state_->entry(name);
    if (!e->ready.load()) {
      std::lock_guard lock(e->mu);
      // Invalidated while this read waited: read the backend itself, once.
      if (e->stale.load()) return inner_->read(name, offset, out);
      if (!e->ready.load()) {
        auto r = download(name, *e);
        if (!r) {
          state_->drop(name, e);
          return r;
        }
      }
    }
    if (offset > e->size || out.size() > e->size - offset)
      return truncated(name, offset, offset < e->size ? e->size - offset : 0, e->size);
    if (out.empty()) return ok();
    int fd = detail::open_retry(e->path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (e->stale.load()) return inner_->read(name, offset, out);  // dropped meanwhile
      return detail::os_error(errc::io, errno, "open", e->path);
    }
    detail::unique_fd guard(fd);
    std::size_t done = 0;
    int err = detail::pread_all(fd, out.data(), out.size(), offset, done);
    if (err != 0 || done < out.size()) {
      error er = detail::os_error(errc::io, err != 0 ? err : EIO, "pread", e->path);
      er.offset = offset + done;
      return er;
    }
    return ok();
  }

  result<void> remove(std::string_view name) {
    return state_->changing(name, [&] { return inner_->remove(name); });
  }

 private:
  // Downloads `name` whole into a temporary file beside its local path, renames it into place
  // and marks `e` ready. Called with e.mu held.
  result<void> download(std::string_view name, detail::cache_entry& e) {
    namespace fs = std::filesystem;
    CAIRN_TRY_ASSIGN(std::uint64_t n, inner_->size(name));
    const fs::path path = state_->dir / std::string(name);
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    const std::string tmp = path.string() + ".part." + std::to_string(::getpid()) + "." +
                            std::to_string(state_->tmp_counter.fetch_add(1));
    int fd = detail::open_retry(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return detail::os_error(errc::io, errno, "create", tmp);
    detail::unique_fd guard(fd);
    auto copied = copy_into(name, n, fd, tmp);
    if (!copied) {
      ::unlink(tmp.c_str());
      return copied;
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      int err = errno;
      ::unlink(tmp.c_str());
      return detail::os_error(errc::io, err, "rename " + tmp + " to", path.string());
    }
    e.path = path.string();
    e.size = n;
    e.ready.store(true);
    state_->downloads.fetch_add(1);
    return ok();
  }

  // Copies the `n` bytes of `name` into `fd` (the file `tmp`), in reads of chunk_ bytes.
  result<void> copy_into(std::string_view name, std::uint64_t n, int fd, const std::string& tmp) {
    detail::progress_meter progress(&state_->progress, "download", n, name);
    std::vector<std::byte> buf(static_cast<std::size_t>(std::min<std::uint64_t>(n, chunk_)));
    for (std::uint64_t off = 0; off < n;) {
      const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(n - off, chunk_));
      CAIRN_TRY(inner_->read(name, off, std::span(buf).first(len)));
      std::size_t done = 0;
      if (int err = detail::pwrite_all(fd, buf.data(), len, off, done); err != 0) {
        error e = detail::os_error(errc::io, err, "pwrite", tmp);
        e.offset = off + done;
        return e;
      }
      off += len;
      progress.add(len);
    }
    return ok();
  }

  error truncated(std::string_view name,
                  std::uint64_t offset,
                  std::uint64_t got,
                  std::uint64_t object_size) const {
    return detail::truncated_read(this->describe(name), offset, got, object_size);
  }

  std::shared_ptr<detail::cache_state> state_;
  std::size_t chunk_;
};

static_assert(storage<cached_storage<memory_storage>>);
static_assert(storage<cached_storage<file_storage>>);

}  // namespace cairn

#if CAIRN_HEADER_ONLY
#  include "cairn/storage/cached-inl.hpp"
#endif
