// cairn/format/dcp/source-inl.hpp: the bodies of cairn/format/dcp/source.hpp (included by it
// when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <variant>

#include "cairn/format/dcp/source.hpp"
#include "cairn/format/registry.hpp"

namespace cairn::dcp {

CAIRN_INLINE result<std::unique_ptr<source>> source::open(storage_ref st) {
  CAIRN_TRY_ASSIGN(dcp::reader rd, dcp::reader::open(st));
  std::unique_ptr<source> s(new source(std::move(rd), st));
  // Objects and common.pt as `load` reads them (not the tensors: strided items are read here,
  // which `dcp_as_metadata` refuses).
  s->meta_.format = "torch_dist";
  s->meta_.block_size = foreign_read_block;
  std::map<std::string, std::uint32_t> files;
  CAIRN_TRY(cairn::detail::add_dcp_objects_and_commons(st, s->reader_, s->meta_, files));
  for (const auto& [fqn, item] : s->reader_.meta().state_dict_metadata) {
    if (const auto* t = std::get_if<dcp::tensor_meta>(&item))
      s->tensors_.push_back({fqn, t->type, t->size});
    else
      s->others_.push_back(fqn);
  }
  return s;
}

CAIRN_INLINE result<void> source::read(const std::vector<stream::box_read>& reqs) {
  for (const auto& r : reqs) CAIRN_TRY(reader_.read_box(r.key, r.region, r.out));
  return ok();
}

}  // namespace cairn::dcp
