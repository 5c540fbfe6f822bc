// buffer_pool (storage/buffer_pool.hpp): buffers of the pool's size, reused once given back,
// never handed to two holders at once, from many threads.
#include "cairn/storage/buffer_pool.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

TEST_CASE("buffer_pool hands out buffers of its size and reuses those given back") {
  CHECK(cairn::buffer_pool{}.size() == std::size_t{8} << 20);
  cairn::buffer_pool pool(4096);
  CHECK(pool.size() == 4096);
  auto a = pool.take();
  auto b = pool.take();
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a.get() != b.get());
  std::memset(a.get(), 0xab, pool.size());  // every byte is writable (ASan checks the bound)
  std::memset(b.get(), 0xcd, pool.size());
  std::byte* pa = a.get();
  std::byte* pb = b.get();
  pool.give(std::move(a));
  pool.give(std::move(b));
  // Both come back; none is fresh while one is free.
  auto c = pool.take();
  auto d = pool.take();
  CHECK(std::set<std::byte*>{c.get(), d.get()} == std::set<std::byte*>{pa, pb});
  auto e = pool.take();  // the pool is empty now: a fresh buffer
  CHECK(e.get() != pa);
  CHECK(e.get() != pb);
}

TEST_CASE("buffer_pool never gives one buffer to two threads at once") {
  cairn::buffer_pool pool(1024);
  constexpr int threads = 4, rounds = 500;
  std::vector<int> bad(threads, 0);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < rounds; ++i) {
        auto buf = pool.take();
        const auto mark = static_cast<std::byte>(t * 31 + i % 7);
        std::memset(buf.get(), static_cast<int>(mark), pool.size());
        std::this_thread::yield();
        for (std::size_t k = 0; k < pool.size(); ++k)
          if (buf[k] != mark) {
            ++bad[t];
            break;
          }
        pool.give(std::move(buf));
      }
    });
  for (auto& t : ts) t.join();
  for (int t = 0; t < threads; ++t) CHECK(bad[t] == 0);
}
