// cairn: command-line tool to inspect and verify checkpoints.
//
//   cairn inspect DIR [--json]   keys, dtypes, shapes, chunks, bytes, world size, metadata
//   cairn verify DIR [--json]    recompute every checksum; exit 0 when all match (DCP and
//                                safetensors have none: their layout is checked, bytes read)
//   cairn unshard SRC DST --format one_file|per_tensor|chunks [--chunk-size 5GB] [--dtype f32]
//                [--fp32-masters]  (the model from a distributed optimizer's fp32 masters)
//   cairn convert SRC DST --format native|torch_dist|one_file|per_tensor|chunks [--dtype f32]
//   cairn diff A B [--json]      tensors added, removed, retyped, reshaped; elements that differ
//                                and the largest absolute difference (streaming, bounded memory)
//   cairn ls ROOT [--json] [--name TEMPLATE] [--latest NAME]
//                                checkpoints under a checkpointer's root: state, format, step,
//                                size, which one `latest` and the tags name
//   cairn rm ROOT NAME... [--incomplete] [--json]
//                                delete checkpoints (never the one latest or a tag names; an
//                                incomplete one only with --incomplete)
// verify, diff, unshard and convert draw a progress bar on stderr when it is a terminal
// (--progress: always; --no-progress: never).
// DIR, SRC and DST may be s3://bucket/prefix when built with cairn::s3 (endpoint and
// credentials from AWS_*).
#include <fmt/core.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/convert/diff.hpp"
#include "cairn/convert/unshard.hpp"
#include "cairn/format/dcp/reader.hpp"
#include "cairn/format/detail/format_util.hpp"
#include "cairn/format/native/metadata.hpp"
#include "cairn/format/native/reader.hpp"
#include "cairn/manager/checkpointer.hpp"
#include "cairn/storage/open.hpp"
#if CAIRN_CLI_S3
#  include "cairn/storage/s3.hpp"
#endif

namespace {

/// Prints the usage on `out`: stdout for --help (exit 0), stderr for a wrong command line (exit 2).
int usage(std::FILE* out = stderr) {
  std::fputs(
      "usage: cairn inspect DIR [--json]\n"
      "       cairn verify DIR [--json]\n"
      "       cairn unshard SRC DST --format one_file|per_tensor|chunks [--chunk-size 5GB]\n"
      "                     [--dtype f32] [--slab 64MiB] [--overwrite] [--fp32-masters]\n"
      "       cairn convert SRC DST --format native|torch_dist|one_file|per_tensor|chunks [--dtype "
      "f32]\n"
      "                     [--chunk-size 5GB] [--slab 64MiB] [--overwrite] [--fp32-masters]\n"
      "       cairn diff A B [--json]\n"
      "       cairn ls ROOT [--json] [--name TEMPLATE] [--latest NAME]\n"
      "       cairn rm ROOT NAME... [--incomplete] [--latest NAME] [--json]\n"
      "  inspect  list keys, dtypes, global shapes, chunk counts, bytes, common values, the\n"
      "           saved world size, format version and content metadata (--json: JSON only\n"
      "           on stdout)\n"
      "  verify   recompute every checksum; exit 0 when all match, 1 naming each bad chunk\n"
      "           (torch_dist and safetensors store none: layout checked, every byte read)\n"
      "  unshard  consolidate a cairn, DCP or safetensors checkpoint into safetensors,\n"
      "           streaming; --fp32-masters: each parameter from the fp32 master weights\n"
      "           a distributed optimizer saved (cairn's libtorch adapter, Megatron), under\n"
      "           the model's keys, without the optimizer's other state\n"
      "  convert  rewrite a cairn, DCP or safetensors checkpoint in another format\n"
      "           (native or cairn, torch_dist or dcp, one_file or safetensors, per_tensor,\n"
      "           chunks), streaming, per-rank objects and common values kept where the format\n"
      "           holds them; neither writes over a checkpoint at DST without --overwrite\n"
      "  diff     compare two checkpoints of any layout: tensors added, removed, with another\n"
      "           dtype or shape, elements that differ and the largest absolute difference;\n"
      "           common values, per-rank objects and the saved world size; exit 0 when the\n"
      "           same, 1 when they differ\n"
      "  ls       the checkpoints under a checkpoint manager's root: complete or not, format,\n"
      "           step (from the checkpoint, or read from its name by --name TEMPLATE such as\n"
      "           step{step:08}), objects, bytes, and which the latest pointer and tags name\n"
      "  rm       delete checkpoints under ROOT: never the one latest or a tag names; an\n"
      "           incomplete one (a save may still be writing it) only with --incomplete\n"
      "  verify, diff, unshard and convert draw a progress bar on stderr when it is a\n"
      "  terminal; --progress draws it always, --no-progress never\n",
      out);
  return out == stdout ? 0 : 2;
}

/// The storage a DIR argument names (cairn::open_storage): a local directory or file://DIR, or
/// s3://bucket/prefix in builds with cairn::s3 (including cairn/storage/s3.hpp registers it);
/// throws cairn::exception naming DIR for anything else.
cairn::any_storage open_dir(const std::string& dir) { return cairn::open_storage(dir).value(); }

/// Whether commands draw a progress bar on stderr (set by main: a terminal, --progress or
/// --no-progress).
bool g_progress = false;
/// A bar line is on stderr without its newline yet.
bool g_bar_open = false;

/// Ends a progress bar's line, if one is open, before other output.
void end_bar() {
  if (!g_bar_open) return;
  std::fputc('\n', stderr);
  g_bar_open = false;
}

/// A progress callback that draws each stage's bar on stderr ("verify [####    ]  42.0%
/// 1.23 / 2.93 GB"; a download also names its object), or an empty one when bars are off.
cairn::progress_callback progress_bar() {
  if (!g_progress) return {};
  return [](const cairn::progress_report& p) {
    const double f = p.total ? static_cast<double>(p.done) / static_cast<double>(p.total) : 1.0;
    const int width = 40, filled = static_cast<int>(f * width);
    fmt::print(stderr, "\r{:<8} [{}{}] {:5.1f}%  {:.2f} / {:.2f} GB{}{}", p.stage,
               std::string(filled, '#'), std::string(width - filled, ' '), 100 * f, p.done / 1e9,
               p.total / 1e9, p.object.empty() ? "" : "  ", p.object);
    g_bar_open = true;
    if (p.done == p.total) end_bar();
    std::fflush(stderr);
  };
}

std::string json_str(std::string_view s) {
  std::string out;
  cairn::format_detail::json_string(out, s);
  return out;
}

using cairn::shape_str;  // "[12, 8]"

// Tensor bytes before and after compression (chunks, replicas written once).
std::pair<std::uint64_t, std::uint64_t> compression_totals(const cairn::checkpoint_metadata& m) {
  std::uint64_t data = 0, stored = 0;
  for (const auto& [k, t] : m.tensors) {
    data += t.chunk_bytes();
    stored += t.stored_bytes();
  }
  return {data, stored};
}

// A DCP item that is no tensor and no cairn object: a Python value torch.save'd by DCP, or the
// raw bytes of a BytesIO. cairn does not load these; inspect lists them.
struct foreign_item {
  std::string key;
  std::string what;
  std::uint64_t bytes = 0;
};

// A short description of a Python value: its type, and the value itself when it is short.
std::string brief(const cairn::pickle::value& v) {
  using k = cairn::pickle::value::kind;
  switch (v.type) {
    case k::integer:
      return fmt::format("int {}", v.i);
    case k::boolean:
      return v.i ? "bool True" : "bool False";
    case k::floating:
      return fmt::format("float {}", v.f);
    case k::string:
      return v.str.size() <= 40 ? fmt::format("str '{}'", v.str)
                                : fmt::format("str of {} bytes", v.str.size());
    case k::list:
    case k::tuple:
    case k::set:
    case k::frozenset:
      return fmt::format("{} of {}", v.describe(), v.elements().size());
    case k::dict:
      return fmt::format("dict of {}", v.entries ? v.entries->size() : 0);
    default:
      return v.describe();
  }
}

// A common value as inspect lists it: stored in the common state (`commons`) or held in the
// metadata itself (`inline_commons`, e.g. what a DCP checkpoint's common.pt holds).
struct common_row {
  std::string path;
  std::string_view kind;
  std::string_view type;
  std::uint64_t bytes;
  std::string value;  ///< common_value::str, or why it could not be read
};

std::vector<common_row> common_rows(cairn::storage_ref st, const cairn::checkpoint_metadata& m) {
  std::vector<common_row> out;
  auto values = cairn::read_commons(st, m);  // reads only when there is a common state
  for (const auto& [k, c] : m.commons) {
    std::string shown =
        "(unreadable: " + (values ? std::string("missing") : values.err().describe()) + ")";
    if (values)
      if (auto it = values->find(k); it != values->end()) shown = it->second.str();
    out.push_back({k, cairn::detail::common_kind_name(c.kind), cairn::dtype_name(c.type), c.nbytes,
                   std::move(shown)});
  }
  for (const auto& [k, c] : m.inline_commons)
    out.push_back({k, cairn::detail::common_kind_name(c.kind), cairn::dtype_name(c.type),
                   c.data.size(), c.str()});
  return out;
}

/// The objects stored under `st` and their bytes, counted as `cairn ls` counts a checkpoint:
/// every object (data, index, common state and metadata files alike).
std::pair<std::size_t, std::uint64_t> stored_totals(cairn::storage_ref st) {
  std::size_t n = 0;
  std::uint64_t bytes = 0;
  if (auto names = st.list("")) {
    for (const auto& name : *names) {
      ++n;
      if (auto s = st.size(name)) bytes += *s;
    }
  }
  return {n, bytes};
}

// The non-tensor items of a DCP checkpoint (empty for other formats or when there are none).
std::vector<foreign_item> dcp_non_tensor_items(cairn::storage_ref st,
                                               const cairn::checkpoint_metadata& m) {
  std::vector<foreign_item> out;
  if (m.format != "torch_dist") return out;
  auto rd = cairn::dcp::reader::open(st);
  if (!rd) return out;
  for (const auto& [fqn, item] : rd->meta().state_dict_metadata) {
    if (!std::holds_alternative<cairn::dcp::bytes_meta>(item) || m.objects.count(fqn)) continue;
    const cairn::dcp::storage_info* where = rd->bytes_item(fqn);
    if (!where) {
      out.push_back({fqn, "no storage entry", 0});
      continue;
    }
    auto a = rd->item(*where);
    out.push_back(
        {fqn, a ? "Python " + brief((*a)->root) : "raw bytes (a BytesIO)", where->length});
  }
  return out;
}

int inspect(const std::string& dir, bool json) {
  cairn::any_storage holder = open_dir(dir);
  cairn::storage_ref st = holder.ref();
  auto m = cairn::read_any_metadata(st);
  if (!m) {
    fmt::print(stderr, "cairn inspect: {}\n", m.err().describe());
    return 2;
  }
  const bool native = m->format == "cairn";
  const std::vector<foreign_item> items = dcp_non_tensor_items(st, *m);
  const std::vector<common_row> commons = common_rows(st, *m);
  const auto [stored_files, stored_bytes] = stored_totals(st);
  if (json) {
    fmt::memory_buffer o;
    auto out = std::back_inserter(o);
    auto [data, stored] = compression_totals(*m);
    // Format version, save id and checksum block size exist in cairn's own format only.
    fmt::format_to(out, "{{\"path\":{},\"format\":{},", json_str(dir), json_str(m->format));
    if (native)
      fmt::format_to(out, "\"format_version\":{},\"save_id\":{},\"block_size\":{},", m->version,
                     json_str(m->save_id), m->block_size);
    fmt::format_to(out,
                   "\"world_size\":{},\"files\":{},\"total_bytes\":{},\"tensor_bytes\":{},"
                   "\"stored_tensor_bytes\":{},\"compression_ratio\":{:.4f},"
                   "\"content_metadata\":{{",
                   m->world_size, stored_files, stored_bytes, data, stored,
                   stored ? static_cast<double>(data) / static_cast<double>(stored) : 1.0);
    bool first = true;
    for (const auto& [k, v] : m->content_metadata) {
      fmt::format_to(out, "{}{}:{}", first ? "" : ",", json_str(k), json_str(v));
      first = false;
    }
    fmt::format_to(out, "}},\"tensors\":[");
    first = true;
    for (const auto& [k, t] : m->tensors) {
      fmt::format_to(out,
                     "{}{{\"key\":{},\"dtype\":\"{}\",\"shape\":[{}],\"chunks\":{},\"bytes\":{},"
                     "\"stored_bytes\":{}}}",
                     first ? "" : ",", json_str(k), cairn::dtype_name(t.type),
                     fmt::join(t.global_shape, ","), t.chunks.size(), t.nbytes(), t.stored_bytes());
      first = false;
    }
    fmt::format_to(out, "],\"objects\":[");
    first = true;
    for (const auto& [k, ob] : m->objects) {
      fmt::format_to(out, "{}{{\"key\":{},\"unique_key\":{},\"bytes\":{}}}", first ? "" : ",",
                     json_str(ob.key), json_str(k), ob.where.nbytes);
      first = false;
    }
    fmt::format_to(out, "],\"common\":[");
    first = true;
    for (const auto& c : commons) {
      fmt::format_to(
          out, "{}{{\"path\":{},\"kind\":\"{}\",\"dtype\":\"{}\",\"bytes\":{},\"value\":{}}}",
          first ? "" : ",", json_str(c.path), c.kind, c.type, c.bytes, json_str(c.value));
      first = false;
    }
    fmt::format_to(out, "],\"non_tensor_items\":[");
    first = true;
    for (const auto& it : items) {
      fmt::format_to(out, "{}{{\"key\":{},\"what\":{},\"bytes\":{}}}", first ? "" : ",",
                     json_str(it.key), json_str(it.what), it.bytes);
      first = false;
    }
    fmt::format_to(out, "]}}\n");
    std::fwrite(o.data(), 1, o.size(), stdout);
    return 0;
  }
  fmt::print("checkpoint     {}\n", dir);
  if (native) {
    fmt::print("format version {}\nsaved by       {} rank(s)\nsave id        {}\n", m->version,
               m->world_size, m->save_id);
    fmt::print("files          {} ({} bytes), checksum blocks of {} bytes\n", stored_files,
               stored_bytes, m->block_size);
  } else {
    fmt::print("format         {} (no checksums)\n", m->format);
    fmt::print("files          {} ({} bytes)\n", stored_files, stored_bytes);
  }
  std::uint64_t index_files = 0, index_bytes = 0;
  for (const auto& f : m->files)
    if (f.role == cairn::file_role::index) ++index_files, index_bytes += f.nbytes;
  if (index_files)
    fmt::print("index          {} index files ({} bytes) hold the chunk records\n", index_files,
               index_bytes);
  if (auto [data, stored] = compression_totals(*m); stored != data)
    fmt::print("compression    zstd: tensor data {} bytes stored in {} (ratio {:.2f})\n", data,
               stored, stored ? static_cast<double>(data) / static_cast<double>(stored) : 1.0);
  if (!m->content_metadata.empty()) {
    fmt::print("content metadata\n");
    for (const auto& [k, v] : m->content_metadata) fmt::print("  {} = {}\n", k, v);
  }
  std::size_t w = 3;
  for (const auto& [k, t] : m->tensors) w = std::max(w, k.size());
  fmt::print("tensors ({})\n", m->tensors.size());
  fmt::print("  {:<{}}  {:<7}  {:<20}  {:>6}  {:>12}\n", "key", w, "dtype", "global shape",
             "chunks", "bytes");
  for (const auto& [k, t] : m->tensors)
    fmt::print("  {:<{}}  {:<7}  {:<20}  {:>6}  {:>12}\n", k, w, cairn::dtype_name(t.type),
               shape_str(t.global_shape), t.chunks.size(), t.nbytes());
  if (!m->objects.empty()) {
    fmt::print("objects ({})\n", m->objects.size());
    for (const auto& [k, ob] : m->objects) fmt::print("  {}  {} bytes\n", k, ob.where.nbytes);
  }
  if (!commons.empty()) {
    fmt::print("common values ({})\n", commons.size());
    std::size_t w = 4, tw = 4;
    for (const auto& c : commons) {
      w = std::max(w, c.path.size());
      tw = std::max(tw, c.type.size() + 1 + c.kind.size());
    }
    for (const auto& c : commons)
      fmt::print("  {:<{}}  {:<{}}  {}\n", c.path, w, fmt::format("{} {}", c.type, c.kind), tw,
                 c.value);
  }
  if (!items.empty()) {
    fmt::print("non-tensor items ({}; cairn does not load them)\n", items.size());
    for (const auto& it : items) fmt::print("  {}  {}  {} bytes\n", it.key, it.what, it.bytes);
  }
  return 0;
}

int verify(const std::string& dir, bool json) {
  cairn::any_storage holder = open_dir(dir);
  cairn::storage_ref st = holder.ref();
  auto report = cairn::verify_any(st, 2, progress_bar());
  end_bar();
  if (!report) {
    fmt::print(stderr, "cairn verify: {}\n", report.err().describe());
    return 2;
  }
  const auto& problems = report->problems;
  if (json) {
    fmt::memory_buffer o;
    auto out = std::back_inserter(o);
    fmt::format_to(out, "{{\"dir\":{},\"format\":{},\"checksummed\":{},\"ok\":{},\"problems\":[",
                   json_str(dir), json_str(report->format), report->checksummed, problems.empty());
    for (std::size_t i = 0; i < problems.size(); ++i)
      fmt::format_to(out, "{}{{\"item\":{},\"error\":{}}}", i ? "," : "",
                     json_str(problems[i].item), json_str(problems[i].err.describe()));
    fmt::format_to(out, "]}}\n");
    std::fwrite(o.data(), 1, o.size(), stdout);
    return problems.empty() ? 0 : 1;
  }
  for (const auto& p : problems) fmt::print("BAD {}: {}\n", p.item, p.err.describe());
  if (!problems.empty()) {
    fmt::print("{}: {} problem(s) found\n", dir, problems.size());
    return 1;
  }
  if (report->checksummed) {
    fmt::print("{}: all checksums match and every tensor's chunks tile it\n", dir);
  } else {
    fmt::print(
        "{}: {} checkpoint: every tensor's chunks tile it, lie inside their files and read back; "
        "the format stores no checksums, so changed values cannot be detected\n",
        dir, report->format);
  }
  return 0;
}

// "5GB" (decimal units, as Hugging Face writes them), "256MiB" (binary), or plain bytes.
std::optional<std::uint64_t> parse_size(const std::string& s) {
  std::size_t end = 0;
  double v;
  try {
    v = std::stod(s, &end);
  } catch (...) {
    return std::nullopt;
  }
  std::string unit = s.substr(end);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::pair<const char*, double> units[] = {{"", 1},
                                                  {"B", 1},
                                                  {"KB", 1e3},
                                                  {"MB", 1e6},
                                                  {"GB", 1e9},
                                                  {"TB", 1e12},
                                                  {"KIB", 1024.0},
                                                  {"MIB", 1048576.0},
                                                  {"GIB", 1073741824.0},
                                                  {"TIB", 1099511627776.0}};
  for (const auto& [u, f] : units)
    if (unit == u && v > 0) return static_cast<std::uint64_t>(v * f);
  return std::nullopt;
}

// `cairn unshard` and `cairn convert`: args after the subcommand name.
int convert_cmd(const std::string& cmd, const std::vector<std::string>& args) {
  namespace cv = cairn::convert;
  if (args.size() < 2) return usage();
  cv::convert_options opt;
  bool have_format = false;
  for (std::size_t i = 2; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--overwrite") {
      opt.overwrite = true;
      continue;
    }
    if (a == "--fp32-masters") {
      opt.fp32_masters = true;
      continue;
    }
    if (i + 1 >= args.size()) return usage();
    const std::string& v = args[++i];
    if (a == "--format" || a == "--strategy") {       // --strategy: the older name
      auto w = cairn::stream::find_stream_writer(v);  // any registered format, by name or alias
      if (!w) {
        fmt::print(stderr, "cairn {}: {}\n", cmd, w.err().describe());
        return 2;
      }
      opt.writer = (*w)->name;
      have_format = true;
    } else if (a == "--chunk-size" || a == "--slab") {
      auto n = parse_size(v);
      if (!n) {
        fmt::print(stderr, "cairn {}: bad size '{}' for {}\n", cmd, v, a);
        return 2;
      }
      (a == "--slab" ? opt.slab_bytes : opt.chunk_size) = *n;
    } else if (a == "--dtype") {
      std::string up = v;
      for (auto& c : up) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      auto t = cairn::dtype_from_name(up);
      if (!t || !cv::convertible_float(*t)) {
        fmt::print(stderr, "cairn {}: --dtype must be f16, bf16, f32 or f64, not '{}'\n", cmd, v);
        return 2;
      }
      opt.to_dtype = *t;
    } else {
      return usage();
    }
  }
  if (!have_format) {
    fmt::print(stderr, "cairn {}: --format is required\n", cmd);
    return 2;
  }
  cairn::any_storage in_holder = open_dir(args[0]), out_holder = open_dir(args[1]);
  cairn::storage_ref in = in_holder.ref(), out = out_holder.ref();
  auto src = cv::open_source(in);
  if (!src) {
    fmt::print(stderr, "cairn {}: {}\n", cmd, src.err().describe());
    return 2;
  }
  opt.progress = progress_bar();
  auto stats = cmd == "unshard" ? cv::unshard(**src, out, opt) : cv::convert(**src, out, opt);
  end_bar();
  if (!stats) {
    fmt::print(stderr, "cairn {}: {}\n", cmd, stats.err().describe());
    return 1;
  }
  fmt::print("{}: {} tensor(s), {} bytes, {} object(s) from {} ({}) -> {} file(s) in {} ({})\n",
             cmd, stats->tensors, stats->bytes_read, stats->objects, args[0], (*src)->kind(),
             stats->files.size(), args[1], opt.writer);
  if (!stats->skipped.empty())
    fmt::print("not carried over (no place in {}): {}\n", opt.writer,
               fmt::join(stats->skipped, ", "));
  return 0;
}

const char* change_name(cairn::convert::tensor_diff::change c) {
  using change = cairn::convert::tensor_diff::change;
  switch (c) {
    case change::added:
      return "added";
    case change::removed:
      return "removed";
    case change::dtype:
      return "dtype";
    case change::shape:
      return "shape";
    case change::values:
      return "values";
  }
  return "?";
}

std::string number_or_null(double x) { return std::isnan(x) ? "null" : fmt::format("{:g}", x); }

int diff_cmd(const std::vector<std::string>& args) {
  bool json = false;
  std::vector<std::string> paths;
  for (const auto& a : args) {
    if (a == "--json")
      json = true;
    else if (a.starts_with("--"))
      return usage();
    else
      paths.push_back(a);
  }
  if (paths.size() != 2) return usage();
  cairn::any_storage ha = open_dir(paths[0]), hb = open_dir(paths[1]);
  auto a = cairn::convert::open_source(ha.ref());
  auto b = a ? cairn::convert::open_source(hb.ref()) : std::move(a);
  if (!a || !b) {
    fmt::print(stderr, "cairn diff: {}\n", (!a ? a : b).err().describe());
    return 2;
  }
  auto d = cairn::convert::diff(**a, **b, 64ull << 20, progress_bar());
  end_bar();
  if (!d) {
    fmt::print(stderr, "cairn diff: {}\n", d.err().describe());
    return 2;
  }
  if (json) {
    fmt::memory_buffer o;
    auto out = std::back_inserter(o);
    fmt::format_to(out,
                   "{{\"a\":{},\"b\":{},\"same\":{},\"compared\":{},\"bytes_compared\":{},"
                   "\"tensors\":[",
                   json_str(paths[0]), json_str(paths[1]), d->same(), d->compared,
                   d->bytes_compared);
    bool first = true;
    for (const auto& t : d->tensors) {
      fmt::format_to(out,
                     "{}{{\"key\":{},\"change\":\"{}\",\"dtype_a\":\"{}\",\"dtype_b\":\"{}\","
                     "\"shape_a\":[{}],\"shape_b\":[{}],\"differing\":{},\"max_abs\":{}}}",
                     first ? "" : ",", json_str(t.key), change_name(t.what),
                     cairn::dtype_name(t.type_a), cairn::dtype_name(t.type_b),
                     fmt::join(t.shape_a, ","), fmt::join(t.shape_b, ","), t.differing,
                     number_or_null(t.max_abs));
      first = false;
    }
    fmt::format_to(out, "],\"commons\":[");
    auto values_json = [&](const std::vector<cairn::convert::value_diff>& vs) {
      for (std::size_t i = 0; i < vs.size(); ++i)
        fmt::format_to(out, "{}{{\"key\":{},\"change\":\"{}\",\"a\":{},\"b\":{}}}", i ? "," : "",
                       json_str(vs[i].key), change_name(vs[i].what), json_str(vs[i].a),
                       json_str(vs[i].b));
    };
    values_json(d->commons);
    fmt::format_to(out, "],\"objects\":[");
    values_json(d->objects);
    fmt::format_to(out, "],\"world_size_a\":{},\"world_size_b\":{}}}\n",
                   d->world_a ? std::to_string(*d->world_a) : "null",
                   d->world_b ? std::to_string(*d->world_b) : "null");
    std::fwrite(o.data(), 1, o.size(), stdout);
    return d->same() ? 0 : 1;
  }
  // One aligned row per difference: what, how, key, detail.
  using change = cairn::convert::tensor_diff::change;
  struct row {
    std::string what, how, key, detail;
  };
  std::vector<row> rows;
  for (const auto& t : d->tensors) {
    std::string detail;
    switch (t.what) {
      case change::added:
        detail = fmt::format("{} {}", cairn::dtype_name(t.type_b), shape_str(t.shape_b));
        break;
      case change::removed:
        detail = fmt::format("{} {}", cairn::dtype_name(t.type_a), shape_str(t.shape_a));
        break;
      case change::dtype:
        detail = fmt::format("{} -> {}", cairn::dtype_name(t.type_a), cairn::dtype_name(t.type_b));
        break;
      case change::shape:
        detail = fmt::format("{} -> {}", shape_str(t.shape_a), shape_str(t.shape_b));
        break;
      case change::values:
        detail = fmt::format("{} of {} elements differ, max |a - b| = {}", t.differing,
                             cairn::numel(t.shape_a), number_or_null(t.max_abs));
        break;
    }
    rows.push_back({"tensor", change_name(t.what), t.key, std::move(detail)});
  }
  auto value_rows = [&](const char* what, const std::vector<cairn::convert::value_diff>& vs) {
    for (const auto& v : vs)
      rows.push_back({what, change_name(v.what), v.key,
                      v.what == change::added     ? v.b
                      : v.what == change::removed ? v.a
                                                  : v.a + " -> " + v.b});
  };
  value_rows("common", d->commons);
  value_rows("object", d->objects);
  std::size_t w_how = 0, w_key = 0;
  for (const auto& r : rows) {
    w_how = std::max(w_how, r.how.size());
    w_key = std::max(w_key, r.key.size());
  }
  for (const auto& r : rows)
    fmt::print("{:<6}  {:<{}}  {:<{}}  {}\n", r.what, r.how, w_how, r.key, w_key, r.detail);
  std::string world = "world size unknown";
  if (d->world_a && d->world_b)
    world = *d->world_a == *d->world_b
                ? fmt::format("both saved by {} rank(s)", *d->world_a)
                : fmt::format("saved by {} and {} ranks", *d->world_a, *d->world_b);
  fmt::print(
      "{} tensor(s) compared ({} bytes each side), {} common value(s) and object(s); "
      "{}; {}\n",
      d->compared, d->bytes_compared, d->values_compared, world,
      d->same() ? "the same" : fmt::format("{} difference(s)", rows.size()));
  return d->same() ? 0 : 1;
}

/// Options shared by `ls` and `rm`: --json, --name TEMPLATE, --latest NAME, --incomplete and
/// the other (positional) arguments.
struct root_args {
  bool json = false, incomplete = false;
  std::optional<cairn::name_template> names;
  std::string latest = "latest";
  std::vector<std::string> positional;
};

std::optional<root_args> parse_root_args(const std::vector<std::string>& args) {
  root_args r;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      r.json = true;
    } else if (a == "--incomplete") {
      r.incomplete = true;
    } else if (a == "--name" && i + 1 < args.size()) {
      auto t = cairn::name_template::parse(args[++i]);
      if (!t) {
        fmt::print(stderr, "cairn: {}\n", t.err().describe());
        return std::nullopt;
      }
      r.names = std::move(*t);
    } else if (a == "--latest" && i + 1 < args.size()) {
      r.latest = args[++i];
    } else if (a.starts_with("--")) {
      return std::nullopt;
    } else {
      r.positional.push_back(a);
    }
  }
  return r;
}

/// The step of a listed checkpoint: from its content metadata (a checkpointer's native save),
/// else from its name by the template.
std::optional<std::int64_t> step_of(cairn::storage_ref root, const cairn::checkpoint_entry& e) {
  if (e.complete && e.format == "cairn") {
    auto sub = cairn::prefixed_storage::make(root, e.name + "/");
    if (sub) {
      auto meta = cairn::read_content_metadata(*sub);
      if (meta) {
        if (auto c = cairn::detail::get_counters(*meta)) return c->step;
      }
    }
  }
  if (e.counters) return e.counters->step;
  return std::nullopt;
}

/// A checkpoint given where a folder of checkpoints belongs: says so on stderr and returns true.
bool refuse_checkpoint_as_root(const std::string& cmd,
                               const std::string& dir,
                               cairn::storage_ref root) {
  auto format = cairn::detect_format(root);
  if (!format || format->empty()) return false;
  fmt::print(stderr,
             "cairn {}: {} is a checkpoint ({}), not a folder of checkpoints: `cairn inspect {}` "
             "shows it; give `cairn {}` the folder that holds it\n",
             cmd, dir, *format, dir, cmd);
  return true;
}

int ls(const root_args& a) {
  if (a.positional.size() != 1) return usage();
  cairn::any_storage holder = open_dir(a.positional[0]);
  cairn::storage_ref root = holder.ref();
  if (refuse_checkpoint_as_root("ls", a.positional[0], root)) return 2;
  auto found = cairn::list_checkpoints(root, a.names ? &*a.names : nullptr, a.latest);
  if (!found) {
    fmt::print(stderr, "cairn ls: {}\n", found.err().describe());
    return 2;
  }
  std::vector<std::optional<std::int64_t>> steps;
  for (const auto& e : *found) steps.push_back(step_of(root, e));
  if (a.json) {
    fmt::memory_buffer o;
    auto out = std::back_inserter(o);
    fmt::format_to(out, "{{\"root\":{},\"checkpoints\":[", json_str(a.positional[0]));
    for (std::size_t i = 0; i < found->size(); ++i) {
      const auto& e = (*found)[i];
      std::vector<std::string> tags;
      for (const auto& t : e.tags) tags.push_back(json_str(t));
      fmt::format_to(out,
                     "{}{{\"name\":{},\"complete\":{},\"format\":{},\"step\":{},\"objects\":{},"
                     "\"bytes\":{},\"latest\":{},\"tags\":[{}]}}",
                     i ? "," : "", json_str(e.name), e.complete, json_str(e.format),
                     steps[i] ? std::to_string(*steps[i]) : "null", e.objects, e.bytes, e.latest,
                     fmt::join(tags, ","));
    }
    fmt::format_to(out, "]}}\n");
    std::fwrite(o.data(), 1, o.size(), stdout);
    return 0;
  }
  std::size_t w = 4;
  for (const auto& e : *found) w = std::max(w, e.name.size());
  fmt::print("{:<{}}  {:<10}  {:<11}  {:>10}  {:>7}  {:>14}  {}\n", "name", w, "state", "format",
             "step", "objects", "bytes", "pointers");
  for (std::size_t i = 0; i < found->size(); ++i) {
    const auto& e = (*found)[i];
    std::vector<std::string> ptrs;
    if (e.latest) ptrs.push_back(a.latest);
    for (const auto& t : e.tags) ptrs.push_back("tags/" + t);
    fmt::print("{:<{}}  {:<10}  {:<11}  {:>10}  {:>7}  {:>14}  {}\n", e.name, w,
               e.complete ? "complete" : "incomplete", e.format.empty() ? "-" : e.format,
               steps[i] ? std::to_string(*steps[i]) : "-", e.objects, e.bytes,
               fmt::join(ptrs, " "));
  }
  return 0;
}

int rm(const root_args& a) {
  if (a.positional.size() < 2) return usage();
  cairn::any_storage holder = open_dir(a.positional[0]);
  cairn::storage_ref root = holder.ref();
  if (refuse_checkpoint_as_root("rm", a.positional[0], root)) return 2;
  auto found = cairn::list_checkpoints(root, nullptr, a.latest);
  if (!found) {
    fmt::print(stderr, "cairn rm: {}\n", found.err().describe());
    return 2;
  }
  int failed = 0;
  fmt::memory_buffer removed, refusals;  // --json: the two lists
  for (std::size_t i = 1; i < a.positional.size(); ++i) {
    const std::string& name = a.positional[i];
    auto it = std::find_if(found->begin(), found->end(),
                           [&](const cairn::checkpoint_entry& e) { return e.name == name; });
    std::string refused;
    if (it == found->end()) {
      refused = "no such checkpoint";
    } else if (it->latest) {
      refused = "the " + a.latest + " pointer names it";
    } else if (!it->tags.empty()) {
      refused = "tag " + it->tags.front() + " names it";
    } else if (!it->complete && !a.incomplete) {
      refused = "it is incomplete (a save may still be writing it); pass --incomplete";
    }
    if (refused.empty())
      if (auto r = cairn::remove_checkpoint(root, name); !r) refused = r.err().describe();
    if (!refused.empty()) {
      ++failed;
      if (a.json)
        fmt::format_to(std::back_inserter(refusals), "{}{{\"name\":{},\"reason\":{}}}",
                       refusals.size() ? "," : "", json_str(name), json_str(refused));
      else
        fmt::print(stderr, "cairn rm: {}: not removed: {}\n", name, refused);
      continue;
    }
    if (a.json)
      fmt::format_to(std::back_inserter(removed), "{}{{\"name\":{},\"objects\":{},\"bytes\":{}}}",
                     removed.size() ? "," : "", json_str(name), it->objects, it->bytes);
    else
      fmt::print("removed {} ({} objects, {} bytes)\n", name, it->objects, it->bytes);
  }
  if (a.json)
    fmt::print("{{\"root\":{},\"removed\":[{}],\"refused\":[{}]}}\n", json_str(a.positional[0]),
               fmt::to_string(removed), fmt::to_string(refusals));
  return failed ? 1 : 0;
}

}  // namespace

int run_cli(const std::vector<std::string>& args);

int main(int argc, char** argv) {
  try {
    return run_cli(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    fmt::print(stderr, "cairn: {}\n", e.what());
    return 2;
  }
}

int run_cli(const std::vector<std::string>& all_args) {
  g_progress = ::isatty(STDERR_FILENO) == 1;
  std::vector<std::string> args;
  for (const auto& a : all_args) {
    if (a == "--progress")
      g_progress = true;
    else if (a == "--no-progress")
      g_progress = false;
    else
      args.push_back(a);
  }
  for (const auto& a : args)
    if (a == "--help" || a == "-h" || a == "help") return usage(stdout);
  if (args.size() < 2) return usage();
  if (args[0] == "inspect") {
    bool json = args.size() == 3 && args[2] == "--json";
    if (args.size() > 3 || (args.size() == 3 && !json)) return usage();
    return inspect(args[1], json);
  }
  if (args[0] == "verify" && args.size() == 2) return verify(args[1], false);
  if (args[0] == "verify" && args.size() == 3 && args[2] == "--json") return verify(args[1], true);
  if (args[0] == "diff") return diff_cmd(std::vector<std::string>(args.begin() + 1, args.end()));
  if (args[0] == "ls" || args[0] == "rm") {
    auto a = parse_root_args(std::vector<std::string>(args.begin() + 1, args.end()));
    if (!a) return usage();
    return args[0] == "ls" ? ls(*a) : rm(*a);
  }
  if (args[0] == "unshard" || args[0] == "convert")
    return convert_cmd(args[0], std::vector<std::string>(args.begin() + 1, args.end()));
  return usage();
}
