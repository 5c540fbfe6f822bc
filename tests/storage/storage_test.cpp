// The storage concept and its helpers (storage/storage.hpp): which types model `storage` and
// `storage_with_temporaries`, storage_features and storage_features_of, storage_ref forwarding
// every call with its arguments and results, and detail::truncated_read's error.
#include "cairn/storage/storage.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/storage/memory.hpp"

namespace storage_concept_test {

// A backend that records every call and answers from its arguments, so that forwarding can be
// told apart from doing nothing.
struct recording {
  std::vector<std::string> calls;
  std::vector<std::byte> written;

  struct writer final : cairn::object_writer {
    recording* owner;
    explicit writer(recording* o) : owner(o) {}
    cairn::result<void> write_at(std::uint64_t offset, std::span<const std::byte> d) override {
      owner->calls.push_back("write_at " + std::to_string(offset) + " " + std::to_string(d.size()));
      return cairn::ok();
    }
    cairn::result<void> finish() override {
      owner->calls.push_back("finish");
      return cairn::make_error(cairn::errc::io, "finish refused");
    }
  };

  cairn::result<void> put(std::string_view n, std::span<const std::byte> d) {
    calls.push_back("put " + std::string(n));
    written.assign(d.begin(), d.end());
    return cairn::ok();
  }
  cairn::result<std::unique_ptr<cairn::object_writer>> open_writer(std::string_view n) {
    calls.push_back("open_writer " + std::string(n));
    return std::unique_ptr<cairn::object_writer>(std::make_unique<writer>(this));
  }
  cairn::result<void> read(std::string_view n, std::uint64_t offset, std::span<std::byte> out) {
    calls.push_back("read " + std::string(n) + " " + std::to_string(offset));
    for (auto& b : out) b = static_cast<std::byte>(offset);
    return cairn::ok();
  }
  cairn::result<std::uint64_t> size(std::string_view n) {
    calls.push_back("size " + std::string(n));
    return n.size() * 1000;
  }
  cairn::result<bool> exists(std::string_view n) {
    calls.push_back("exists " + std::string(n));
    return n == "yes";
  }
  cairn::result<std::vector<std::string>> list(std::string_view p) {
    calls.push_back("list " + std::string(p));
    return std::vector<std::string>{std::string(p) + "1", std::string(p) + "2"};
  }
  cairn::result<void> remove(std::string_view n) {
    calls.push_back("remove " + std::string(n));
    cairn::error e = cairn::make_error(cairn::errc::not_found, "no " + describe(n));
    e.file = describe(n);
    return e;
  }
  std::string describe(std::string_view n) const { return "rec://" + std::string(n); }
};

struct static_features : recording {
  static constexpr cairn::storage_features features{.durable = true,
                                                    .shared_between_processes = true};
};

struct member_features : recording {
  cairn::storage_features features() const { return {.atomic_put = true}; }
};

struct with_temporaries : recording {
  cairn::result<std::size_t> remove_temporaries(std::string_view p) {
    calls.push_back("remove_temporaries " + std::string(p));
    return std::size_t{7};
  }
};

struct mutable_describe : recording {
  std::string describe(std::string_view n) { return std::string(n); }  // not const
};

struct bool_exists : recording {
  bool exists(std::string_view) { return true; }  // not a result<bool>
};

struct int_temporaries : recording {
  int remove_temporaries(std::string_view) { return 0; }
};

}  // namespace storage_concept_test

static_assert(cairn::storage<storage_concept_test::recording>);
static_assert(cairn::storage<cairn::storage_ref>);
static_assert(!cairn::storage<storage_concept_test::mutable_describe>);
static_assert(!cairn::storage<storage_concept_test::bool_exists>);
static_assert(!cairn::storage<int>);
static_assert(!cairn::storage_with_temporaries<storage_concept_test::recording>);
static_assert(cairn::storage_with_temporaries<storage_concept_test::with_temporaries>);
static_assert(!cairn::storage_with_temporaries<storage_concept_test::int_temporaries>);

TEST_SUITE("storage") {
  TEST_CASE("storage_features promise nothing by default and compare every field") {
    const cairn::storage_features none{};
    CHECK(none == cairn::storage_features{false, false, false, false, false, false});
    bool cairn::storage_features::*fields[] = {&cairn::storage_features::read_after_write,
                                               &cairn::storage_features::list_after_write,
                                               &cairn::storage_features::atomic_put,
                                               &cairn::storage_features::writer_hidden_until_finish,
                                               &cairn::storage_features::durable,
                                               &cairn::storage_features::shared_between_processes};
    for (auto field : fields) {
      cairn::storage_features one{};
      one.*field = true;
      CHECK(one != none);
      for (auto other : fields) {
        cairn::storage_features two{};
        two.*other = true;
        CHECK((one == two) == (field == other));
      }
    }
  }

  TEST_CASE("storage_features_of reads the static member, else the member function, else none") {
    storage_concept_test::recording plain;
    storage_concept_test::static_features stat;
    storage_concept_test::member_features member;
    CHECK(cairn::storage_features_of(plain) == cairn::storage_features{});
    CHECK(cairn::storage_features_of(stat) ==
          cairn::storage_features{.durable = true, .shared_between_processes = true});
    CHECK(cairn::storage_features_of(member) == cairn::storage_features{.atomic_put = true});
    CHECK(cairn::storage_ref(plain).features() == cairn::storage_features{});
    CHECK(cairn::storage_ref(stat).features() == stat.features);
    CHECK(cairn::storage_ref(member).features() == member.features());
    cairn::memory_storage mem;
    cairn::storage_ref ref = mem;
    CHECK(cairn::storage_features_of(ref) == cairn::memory_storage::features);
  }

  TEST_CASE("storage_ref forwards every call with its arguments and results") {
    storage_concept_test::recording rec;
    const cairn::storage_ref s = rec;
    const std::byte data[3] = {std::byte{1}, std::byte{2}, std::byte{3}};
    REQUIRE(s.put("a/p", data).has_value());
    CHECK(rec.written == std::vector<std::byte>(data, data + 3));

    auto w = s.open_writer("a/w");
    REQUIRE(w.has_value());
    REQUIRE((*w)->write_at(40, data).has_value());
    auto fin = (*w)->finish();
    REQUIRE(!fin);
    CHECK(fin.err().message == "finish refused");

    std::byte out[2] = {};
    REQUIRE(s.read("a/r", 9, out).has_value());
    CHECK(out[0] == std::byte{9});
    CHECK(out[1] == std::byte{9});
    CHECK(s.size("abc").value() == 3000);
    CHECK(s.exists("yes").value());
    CHECK(!s.exists("no").value());
    CHECK(s.list("p/").value() == std::vector<std::string>{"p/1", "p/2"});
    auto rm = s.remove("gone");
    REQUIRE(!rm);
    CHECK(rm.err().code == cairn::errc::not_found);
    CHECK(rm.err().file == "rec://gone");
    CHECK(s.describe("a/b") == "rec://a/b");
    // Without remove_temporaries the answer is 0 and the backend is not called.
    CHECK(s.remove_temporaries("a/").value() == 0);

    CHECK(rec.calls == std::vector<std::string>{"put a/p", "open_writer a/w", "write_at 40 3",
                                                "finish", "read a/r 9", "size abc", "exists yes",
                                                "exists no", "list p/", "remove gone"});

    // A copy refers to the same backend, not to the first reference.
    cairn::storage_ref copy = s;
    cairn::storage_ref copy_of_copy(copy);
    CHECK(copy_of_copy.exists("yes").value());
    CHECK(rec.calls.back() == "exists yes");
    CHECK(rec.calls.size() == 11);
  }

  TEST_CASE("storage_ref forwards remove_temporaries when the backend has it") {
    storage_concept_test::with_temporaries rec;
    cairn::storage_ref s = rec;
    CHECK(s.remove_temporaries("step/").value() == 7);
    CHECK(rec.calls == std::vector<std::string>{"remove_temporaries step/"});
  }

  TEST_CASE("truncated_read names the object, the offset and where the object ends") {
    const cairn::error e = cairn::detail::truncated_read("mem://s/x.bin", 90, 10, 100);
    CHECK(e.code == cairn::errc::corrupt);
    CHECK(e.file == "mem://s/x.bin");
    REQUIRE(e.offset.has_value());
    CHECK(*e.offset == 100);  // where the data ran out
    CHECK(e.message.find("truncated") != std::string::npos);
    CHECK(e.message.find("mem://s/x.bin") != std::string::npos);
    CHECK(e.message.find("offset 90") != std::string::npos);
    CHECK(e.message.find("ends at byte 100") != std::string::npos);

    const cairn::error beyond = cairn::detail::truncated_read("f", 500, 0, 100);
    CHECK(*beyond.offset == 500);
    CHECK(beyond.message.find("ends at byte 100") != std::string::npos);
    CHECK(beyond.describe().find("offset=500") != std::string::npos);
  }
}
