// Where each saving rank is, in shared memory a checker can read after SIGKILL; and a storage
// decorator that keeps it up to date. The page is a MAP_SHARED file mapping: what a process
// stored stays in the page cache when it is killed, so the checker sees the last phase every
// rank reached.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "cairn/cairn.hpp"

namespace crash {

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process on the machine.
inline std::int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

/// What a rank is doing, as far as storage calls tell.
enum phase : std::uint32_t {
  idle,                  ///< building the next step's state (between saves)
  plan,                  ///< in save, before writing: describing, planning, reading what is there
  write_data,            ///< writing its data file
  sync_data,             ///< finishing (fdatasync) its data file
  put_common,            ///< writing the common state (rank 0) or an index file (version 4)
  exchange,              ///< its files are written; waiting for the other ranks / the commit
  put_metadata,          ///< writing metadata.json (rank 0): the commit
  committed,             ///< metadata.json is written; removing old files, telling the ranks
  removing,              ///< inside a storage remove (old files after a commit, or an abandon)
  removing_temporaries,  ///< removing temporary files of killed puts (after a commit)
  returned,              ///< save returned; recording the result
  phase_count
};

inline const char* phase_name(std::uint32_t p) {
  static const char* const names[] = {"between saves",      "plan",         "write data",
                                      "sync data",          "write common", "wait for ranks",
                                      "write metadata",     "after commit", "remove",
                                      "remove temporaries", "returned"};
  static_assert(std::size(names) == phase_count);
  return p < phase_count ? names[p] : "?";
}

/// One rank's slot.
struct alignas(64) slot {
  std::atomic<std::int32_t> pid;
  std::atomic<std::uint32_t> phase;
  std::atomic<std::int64_t> step;        ///< the step of the save in progress or last made
  std::atomic<std::int64_t> started_ns;  ///< when that save started
  std::atomic<std::int64_t> save_ns;     ///< how long the last completed save took
  std::atomic<std::int64_t> saves;       ///< saves completed
};
static_assert(std::atomic<std::int64_t>::is_always_lock_free);

inline constexpr int max_ranks = 16;

struct page {
  slot slots[max_ranks];
};

/// Maps the probe file `path` (created zeroed with `create`); munmap(page, sizeof(page)) ends it.
inline page* map_page(const std::string& path, bool create) {
  int fd = ::open(path.c_str(), create ? (O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC) : O_RDWR, 0644);
  if (fd < 0) throw std::runtime_error("cannot open probe file " + path);
  if (create && ::ftruncate(fd, sizeof(page)) != 0) {
    ::close(fd);
    throw std::runtime_error("cannot size probe file " + path);
  }
  void* p = ::mmap(nullptr, sizeof(page), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw std::runtime_error("cannot map probe file " + path);
  return static_cast<page*>(p);
}

/// Forwards to a storage backend and records in `slot` which step of a save the rank is in.
/// Forwards the optional members of the backend too (`remove_temporaries`), so a save through
/// it does what a save through the backend does.
template <class S>
class probe_storage {
 public:
  probe_storage(S& inner, slot& s) : inner_(inner), slot_(s) {}

  cairn::result<void> put(std::string_view name, std::span<const std::byte> data) {
    // metadata.json of a checkpoint, at the root or under a checkpointer's prefix ("step1/").
    bool meta = name == cairn::metadata_name ||
                (name.ends_with(cairn::metadata_name) &&
                 name[name.size() - cairn::metadata_name.size() - 1] == '/');
    set(meta ? put_metadata : put_common);
    auto r = inner_.put(name, data);
    set(meta ? committed : exchange);
    return r;
  }
  cairn::result<std::unique_ptr<cairn::object_writer>> open_writer(std::string_view name) {
    set(write_data);
    auto w = inner_.open_writer(name);
    if (!w) return std::move(w).err();
    return std::unique_ptr<cairn::object_writer>(std::make_unique<writer>(std::move(*w), slot_));
  }
  cairn::result<void> read(std::string_view name,
                           std::uint64_t offset,
                           std::span<std::byte> out) const {
    return inner_.read(name, offset, out);
  }
  cairn::result<std::uint64_t> size(std::string_view name) const { return inner_.size(name); }
  cairn::result<bool> exists(std::string_view name) const { return inner_.exists(name); }
  cairn::result<std::vector<std::string>> list(std::string_view prefix) const {
    return inner_.list(prefix);
  }
  cairn::result<void> remove(std::string_view name) {
    std::uint32_t before = slot_.phase.load();
    set(removing);
    auto r = inner_.remove(name);
    set(before);
    return r;
  }
  std::string describe(std::string_view name) const { return inner_.describe(name); }
  auto remove_temporaries(std::string_view prefix) requires requires(S& s) {
    s.remove_temporaries(prefix);
  }
  {
    std::uint32_t before = slot_.phase.load();
    set(removing_temporaries);
    auto r = inner_.remove_temporaries(prefix);
    set(before);
    return r;
  }

 private:
  class writer final : public cairn::object_writer {
   public:
    writer(std::unique_ptr<cairn::object_writer> w, slot& s) : w_(std::move(w)), slot_(s) {}
    cairn::result<void> write_at(std::uint64_t offset, std::span<const std::byte> data) override {
      return w_->write_at(offset, data);
    }
    cairn::result<void> finish() override {
      slot_.phase.store(sync_data);
      auto r = w_->finish();
      slot_.phase.store(exchange);
      return r;
    }

   private:
    std::unique_ptr<cairn::object_writer> w_;
    slot& slot_;
  };
  void set(std::uint32_t p) { slot_.phase.store(p); }

  S& inner_;
  slot& slot_;
};

static_assert(cairn::storage<probe_storage<cairn::file_storage>>);

}  // namespace crash
