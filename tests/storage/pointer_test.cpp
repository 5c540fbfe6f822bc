// Pointer objects (storage/pointer.hpp): read_pointer gives the trimmed name a pointer holds,
// nothing for an absent pointer or one that holds no single valid name, and the storage's error
// when reading fails; write_pointer writes what read_pointer reads back.
#include "cairn/storage/pointer.hpp"

#include <doctest/doctest.h>

#include <span>
#include <string>
#include <string_view>

#include "cairn/storage/fault_injection.hpp"
#include "cairn/storage/memory.hpp"

namespace pointer_test {

void put_text(cairn::storage_ref st, std::string_view name, const std::string& text) {
  REQUIRE(st.put(name, std::as_bytes(std::span(text))).has_value());
}

TEST_SUITE("pointer") {
  TEST_CASE("read_pointer: the name, trimmed, or nothing for what is not one name") {
    cairn::memory_storage mem;
    CHECK(cairn::detail::read_pointer(mem, "latest").value() == std::nullopt);  // absent
    cairn::detail::write_pointer(mem, "latest", "step_000030").value();
    CHECK(cairn::detail::read_pointer(mem, "latest").value() == "step_000030");
    put_text(mem, "crlf", "global_step10 \r\n");
    CHECK(cairn::detail::read_pointer(mem, "crlf").value() == "global_step10");
    for (const std::string& bad :
         {std::string(""), std::string("\n"), std::string("a/b"), std::string(".."),
          std::string("/abs"), std::string(5000, 'x')}) {
      CAPTURE(bad.size());
      put_text(mem, "bad", bad);
      CHECK(cairn::detail::read_pointer(mem, "bad").value() == std::nullopt);
    }
  }

  TEST_CASE("read_pointer passes the storage's failure on") {
    cairn::memory_storage mem;
    cairn::faulty_storage<cairn::memory_storage> f{mem};
    cairn::detail::write_pointer(f, "latest", "step_1").value();
    f.fail_reads_of("latest");
    auto r = cairn::detail::read_pointer(f, "latest");
    REQUIRE_FALSE(r);
    CHECK(r.err().code != cairn::errc::not_found);
  }
}

}  // namespace pointer_test
