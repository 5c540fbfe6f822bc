// Fuzz target "messages": every message ranks exchange (detail/message.hpp and the message
// structs beside each step: docs/architecture.md, "Messages between ranks"). The first byte
// picks the message type, the rest is decoded as one. Decoding must never crash or throw, and
// an input it accepts must be the one encoding of its value: encoding it again gives the same
// bytes (the codec has no second spelling of a value for a peer to hide a difference in).
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cairn/comm/agree.hpp"
#include "cairn/detail/message.hpp"
#include "cairn/format/dcp/strategy.hpp"
#include "cairn/format/native/strategy.hpp"
#include "cairn/manager/checkpointer.hpp"
#include "cairn/pipeline/load.hpp"
#include "cairn/pipeline/save.hpp"
#include "cairn/pipeline/scalable_plan.hpp"
#include "cairn/plan/scalable.hpp"
#include "tests/system/fuzz/fuzz.hpp"

namespace {

template <class T>
void decode_as(std::span<const std::byte> in) {
  cairn::result<T> r = cairn::detail::decode_message<T>(in);
  if (!r) {
    cairn_fuzz::check(r.err().code == cairn::errc::comm, "a malformed message is not errc::comm");
    return;
  }
  const cairn::bytes again = cairn::detail::encode_message(*r);
  cairn_fuzz::check(
      again.size() == in.size() && std::memcmp(again.data(), in.data(), in.size()) == 0,
      "an accepted message does not encode to the same bytes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  namespace d = cairn::detail;
  const std::span<const std::byte> in = cairn_fuzz::bytes(data, size).subspan(1);
  switch (data[0] % 24) {
    case 0:
      decode_as<d::status_message>(in);
      break;
    case 1:
      decode_as<std::vector<cairn::bytes>>(in);
      break;
    case 2:
      decode_as<cairn::rank_desc>(in);
      break;
    case 3:
      decode_as<d::plan_vote_message>(in);
      break;
    case 4:
      decode_as<d::plan_verdict_message>(in);
      break;
    case 5:
      decode_as<d::root_said_message>(in);
      break;
    case 6:
      decode_as<d::claims_message>(in);
      break;
    case 7:
      decode_as<d::slots_message>(in);
      break;
    case 8:
      decode_as<d::index_part_message>(in);
      break;
    case 9:
      decode_as<d::native_write_report>(in);
      break;
    case 10:
      decode_as<d::native_index_report>(in);
      break;
    case 11:
      decode_as<d::routed_sections>(in);
      break;
    case 12:
      decode_as<d::dcp_write_report>(in);
      break;
    case 13:
      decode_as<d::metadata_message>(in);
      break;
    case 14:
      decode_as<std::vector<std::string>>(in);
      break;
    case 15:
      decode_as<std::vector<d::piece_claim>>(in);
      break;
    case 16:
      decode_as<d::resolved_message>(in);
      break;
    case 17:
      decode_as<d::proposed_name_message>(in);
      break;
    case 18:
      decode_as<d::published_message>(in);
      break;
    case 19:
      decode_as<d::latest_message>(in);
      break;
    case 21:
      decode_as<std::vector<d::piece_route>>(in);
      break;
    case 22:
      decode_as<d::planning_start_message>(in);
      break;
    case 23:
      decode_as<d::held_commons_message>(in);
      break;
    default:
      decode_as<std::uint64_t>(in);
      break;  // the structure hash
  }
  return 0;
}
