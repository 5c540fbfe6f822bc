// Helpers of the s3 save/load tests: a state_dict of row- or column-block shards of a few
// tensors with deterministic contents (tests/support/test_util.hpp), per rank.
#pragma once

#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "tests/support/test_util.hpp"

namespace cairn_s3_test {

/// One tensor: key, dtype, global shape.
struct tensor_spec {
  std::string key;
  cairn::dtype type;
  cairn::shape global;
};

/// The tensors every s3 save/load test uses (≈ 2.3 MiB in all).
inline std::vector<tensor_spec> specs() {
  return {{"w", cairn::dtype::f32, {512, 1024}},
          {"emb", cairn::dtype::bf16, {300, 128}},
          {"bias", cairn::dtype::f32, {1000}}};
}

/// A rank's buffers and the state_dict viewing them: tensor i split along axis `axis % ndim`
/// into `world` nearly equal blocks, this rank holding block `rank`. With `fill`, the buffers
/// hold the deterministic values (`salt` changes them), else a filler byte.
struct rank_state {
  std::vector<std::vector<std::byte>> buffers;
  std::vector<cairn::box> blocks;
  cairn::state_dict sd;

  rank_state(int rank, int world, int axis, bool fill, const std::string& salt = "") {
    auto sp = specs();
    buffers.resize(sp.size());
    for (std::size_t i = 0; i < sp.size(); ++i) {
      const auto& s = sp[i];
      std::size_t a = static_cast<std::size_t>(axis) % s.global.size();
      cairn::box b;
      b.offset = cairn::shape(s.global.size(), 0);
      b.size = s.global;
      std::int64_t n = s.global[a];
      b.offset[a] = n * rank / world;
      b.size[a] = n * (rank + 1) / world - b.offset[a];
      blocks.push_back(b);
      std::size_t es = cairn::dtype_size(s.type);
      buffers[i].assign(static_cast<std::size_t>(b.volume()) * es, std::byte{0x5a});
      if (fill) cairn_test::fill_block(s.key + salt, s.type, s.global, b, buffers[i].data());
      cairn::sharded_tensor<> t;
      t.key = s.key;
      t.type = s.type;
      t.local_shape = b.size;
      t.global_shape = s.global;
      t.global_offset = b.offset;
      t.data = buffers[i];
      sd.add(s.key, t);
    }
  }

  /// Whether the buffers hold the deterministic values of `salt`.
  bool holds(const std::string& salt = "") const {
    auto sp = specs();
    for (std::size_t i = 0; i < sp.size(); ++i) {
      std::vector<std::byte> want(buffers[i].size());
      cairn_test::fill_block(sp[i].key + salt, sp[i].type, sp[i].global, blocks[i], want.data());
      if (want != buffers[i]) return false;
    }
    return true;
  }
};

}  // namespace cairn_s3_test
