// put_checked (format/commit.hpp): the commit object is put, its size read back, put again once
// when a lying backend stored less, and the commit fails naming the file when it is still short.
#include "cairn/format/commit.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "cairn/storage/decorator.hpp"
#include "cairn/storage/fault_injection.hpp"
#include "cairn/storage/memory.hpp"

namespace commit_test {

/// A backend whose `put` stores only the first half of the bytes and reports success for its
/// first `lies` calls, or fails without naming a file when `refuse` is set.
struct lying_disk : cairn::storage_decorator<cairn::memory_storage> {
  using storage_decorator::storage_decorator;
  int lies = 0;
  bool refuse = false;
  int puts = 0;
  cairn::result<void> put(std::string_view name, std::span<const std::byte> data) {
    ++puts;
    if (refuse) return cairn::make_error(cairn::errc::io, "no space left on device");
    if (lies > 0) {
      --lies;
      return inner_->put(name, data.first(data.size() / 2));
    }
    return inner_->put(name, data);
  }
};

inline std::vector<std::byte> payload(std::size_t n) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>(i * 7 + 1);
  return b;
}

inline std::vector<std::byte> stored(cairn::memory_storage& mem, std::string_view name) {
  std::vector<std::byte> b(mem.size(name).value());
  mem.read(name, 0, b).value();
  return b;
}

}  // namespace commit_test

TEST_CASE("put_checked writes the object once when storage holds all of it") {
  cairn::memory_storage mem;
  commit_test::lying_disk disk{mem};
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4099}}) {
    INFO("bytes " << n);
    disk.puts = 0;
    auto data = commit_test::payload(n);
    REQUIRE(cairn::put_checked(disk, "metadata.json", data));
    CHECK(disk.puts == 1);
    CHECK(commit_test::stored(mem, "metadata.json") == data);
  }
}

TEST_CASE("put_checked puts again once after a short write reported as done") {
  cairn::memory_storage mem;
  commit_test::lying_disk disk{mem};
  disk.lies = 1;
  auto data = commit_test::payload(1000);
  REQUIRE(cairn::put_checked(disk, ".metadata", data));
  CHECK(disk.puts == 2);
  CHECK(commit_test::stored(mem, ".metadata") == data);

  // The fault injector's lying disk, on the first operation only: the same repair.
  cairn::memory_storage mem2;
  cairn::faulty_storage faulty{mem2};
  faulty.fail_op(0, cairn::fault_mode::lie_partial);
  REQUIRE(cairn::put_checked(faulty, "m", data));
  CHECK(faulty.fault_fired());
  CHECK(commit_test::stored(mem2, "m") == data);
}

TEST_CASE("put_checked fails naming the file and both sizes when the object stays short") {
  cairn::memory_storage mem;
  commit_test::lying_disk disk{mem};
  disk.lies = 5;
  auto data = commit_test::payload(64);
  auto r = cairn::put_checked(disk, "metadata.json", data);
  REQUIRE(!r);
  CHECK(disk.puts == 2);  // one retry, no more
  CHECK(r.err().code == cairn::errc::io);
  CHECK(r.err().file == "mem://metadata.json");
  CHECK(r.err().message.find("64 bytes") != std::string::npos);
  CHECK(r.err().message.find("holds 32") != std::string::npos);
}

TEST_CASE("put_checked passes on a failed put or size with the file named") {
  auto data = commit_test::payload(16);
  SUBCASE("a put that fails without naming the file") {
    cairn::memory_storage mem;
    commit_test::lying_disk disk{mem};
    disk.refuse = true;
    auto r = cairn::put_checked(disk, "ckpt/.metadata", data);
    REQUIRE(!r);
    CHECK(disk.puts == 1);
    CHECK(r.err().message.find("no space left") != std::string::npos);
    CHECK(r.err().file == "mem://ckpt/.metadata");
    CHECK(!mem.exists("ckpt/.metadata").value());
  }
  SUBCASE("the size read back fails") {
    cairn::memory_storage mem;
    cairn::faulty_storage faulty{mem};
    faulty.fail_op(1, cairn::fault_mode::fail);  // op 0 is the put, op 1 the size
    auto r = cairn::put_checked(faulty, "m", data);
    REQUIRE(!r);
    CHECK(faulty.fault_site().find("size") != std::string::npos);
    CHECK(r.err().file == "mem://m");
  }
  SUBCASE("a lost acknowledgement is a failure, though the bytes are there") {
    cairn::memory_storage mem;
    cairn::faulty_storage faulty{mem};
    faulty.fail_op(0, cairn::fault_mode::lost_ack);
    auto r = cairn::put_checked(faulty, "m", data);
    REQUIRE(!r);
    CHECK(r.err().file == "mem://m");
    CHECK(commit_test::stored(mem, "m") == data);
  }
}
