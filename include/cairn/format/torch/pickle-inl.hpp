// cairn/format/torch/pickle-inl.hpp: the bodies of cairn/format/torch/pickle.hpp (included by it
// when header-only; compiled once into cairn::compiled with CAIRN_SEPARATE_COMPILATION).
#pragma once

#include <algorithm>
#include <bit>
#include <cstring>
#include <new>
#include <stdexcept>
#include <unordered_map>

#include "cairn/format/torch/pickle.hpp"

namespace cairn::pickle {

CAIRN_INLINE value
value::instance(std::string module, std::string name, value args, value state, bool newobj) {
  value v;
  v.type = kind::object;
  v.obj = std::make_shared<object>();
  v.obj->module = std::move(module);
  v.obj->name = std::move(name);
  v.obj->args = std::move(args);
  v.obj->state = std::move(state);
  v.obj->newobj = newobj;
  return v;
}

CAIRN_INLINE std::string value::describe() const {
  switch (type) {
    case kind::none:
      return "None";
    case kind::boolean:
      return "bool";
    case kind::integer:
    case kind::big_integer:
      return "int";
    case kind::floating:
      return "float";
    case kind::string:
      return "str";
    case kind::bytes:
      return "bytes";
    case kind::list:
      return "list";
    case kind::tuple:
      return "tuple";
    case kind::dict:
      return "dict";
    case kind::set:
      return "set";
    case kind::frozenset:
      return "frozenset";
    case kind::global:
      return "global " + str + "." + name;
    case kind::object:
      return "object " + obj->module + "." + obj->name;
    case kind::persistent_id:
      return "persistent id";
  }
  return "?";
}

CAIRN_INLINE value value::boolean(bool b) {
  value v;
  v.type = kind::boolean;
  v.i = b;
  return v;
}

CAIRN_INLINE value value::integer(std::int64_t x) {
  value v;
  v.type = kind::integer;
  v.i = x;
  return v;
}

CAIRN_INLINE value value::floating(double x) {
  value v;
  v.type = kind::floating;
  v.f = x;
  return v;
}

CAIRN_INLINE value value::string(std::string s) {
  value v;
  v.type = kind::string;
  v.str = std::move(s);
  return v;
}

CAIRN_INLINE value value::bytes(std::string b) {
  value v = string(std::move(b));
  v.type = kind::bytes;
  return v;
}

CAIRN_INLINE value value::sequence(kind k, std::vector<value> xs) {
  value v;
  v.type = k;
  v.items = std::make_shared<std::vector<value>>(std::move(xs));
  return v;
}

CAIRN_INLINE value value::dict(std::vector<std::pair<value, value>> es) {
  value v;
  v.type = kind::dict;
  v.entries = std::make_shared<std::vector<std::pair<value, value>>>(std::move(es));
  return v;
}

CAIRN_INLINE value value::global(std::string module, std::string name) {
  value v;
  v.type = kind::global;
  v.str = std::move(module);
  v.name = std::move(name);
  return v;
}

CAIRN_INLINE value value::persistent(value pid) {
  value v = sequence(kind::persistent_id, {std::move(pid)});
  return v;
}

CAIRN_INLINE value value::instance(std::string module, std::string name, value args) {
  return instance(std::move(module), std::move(name), std::move(args), none(), true);
}

CAIRN_INLINE const std::vector<value>& value::elements() const noexcept {
  static const std::vector<value> empty;
  return items ? *items : empty;
}

CAIRN_INLINE const value* value::get(std::string_view key) const noexcept {
  if (type != kind::dict || !entries) return nullptr;
  for (const auto& [k, v] : *entries)
    if (k.type == kind::string && k.str == key) return &v;
  return nullptr;
}

CAIRN_INLINE const value* object::attr(std::string_view attr) const noexcept {
  if (const value* v = state.get(attr)) return v;
  if (state.type == value::kind::tuple && state.items && state.items->size() == 2) {
    for (const auto& part : *state.items)
      if (const value* v = part.get(attr)) return v;
  }
  return nullptr;
}

}  // namespace cairn::pickle

namespace cairn::pickle::detail {

CAIRN_INLINE const void* node_id(const value& v) noexcept {
  using k = value::kind;
  switch (v.type) {
    case k::list:
    case k::tuple:
    case k::set:
    case k::frozenset:
    case k::persistent_id:
      return v.items.get();
    case k::dict:
      return v.entries.get();
    case k::object:
      return v.obj.get();
    default:
      return nullptr;
  }
}

CAIRN_INLINE const value* child(const value& v, std::size_t i) noexcept {
  if (v.type == value::kind::dict) {
    const auto& es = *v.entries;
    if (i / 2 >= es.size()) return nullptr;
    return i % 2 ? &es[i / 2].second : &es[i / 2].first;
  }
  if (v.type == value::kind::object) {
    const object& o = *v.obj;
    if (i < 2) return i == 0 ? &o.args : &o.state;
    i -= 2;
    if (i < o.list_items.size()) return &o.list_items[i];
    i -= o.list_items.size();
    if (i / 2 >= o.dict_items.size()) return nullptr;
    return i % 2 ? &o.dict_items[i / 2].second : &o.dict_items[i / 2].first;
  }
  return i < v.items->size() ? &(*v.items)[i] : nullptr;
}

CAIRN_INLINE weight weight::of(const value& v) noexcept {
  std::uint64_t b = v.str.size() + v.name.size();
  if (v.type == value::kind::object && v.obj) b += v.obj->module.size() + v.obj->name.size();
  return {1, b};
}

CAIRN_INLINE weight& weight::operator+=(const weight& o) noexcept {
  nodes = o.nodes > UINT64_MAX - nodes ? UINT64_MAX : nodes + o.nodes;
  bytes = o.bytes > UINT64_MAX - bytes ? UINT64_MAX : bytes + o.bytes;
  return *this;
}

CAIRN_INLINE arena::~arena() {
  for (entry& e : entries_) {
    if (e.state == done) continue;  // part of the result
    if (e.type == value::kind::dict) {
      static_cast<std::vector<std::pair<value, value>>*>(e.keep.get())->clear();
    } else if (e.type == value::kind::object) {
      auto* o = static_cast<object*>(e.keep.get());
      o->args = value();
      o->state = value();
      o->list_items.clear();
      o->dict_items.clear();
    } else {
      static_cast<std::vector<value>*>(e.keep.get())->clear();
    }
  }
}

CAIRN_INLINE void arena::add(const value& v, std::uint64_t offset) {
  if (!node_id(v)) return;
  std::shared_ptr<void> keep;
  if (v.type == value::kind::dict)
    keep = v.entries;
  else if (v.type == value::kind::object)
    keep = v.obj;
  else
    keep = v.items;
  entries_.push_back(entry{std::move(keep), offset, {}, 1, v.type, white});
}

CAIRN_INLINE bool arena::charge(const value& v) noexcept {
  copied_ += weight::of(v);
  return copied_.within(budget_);
}

CAIRN_INLINE result<void> arena::check(const value& root, std::string_view file) {
  if (!node_id(root)) {
    if (!weight::of(root).within(budget_)) return too_big(file, 0);
    return ok();
  }
  build_index();
  if (max_depth_ == 0) return too_deep(file, 0);
  struct frame {
    const value* v;
    entry* n;
    std::size_t next;
  };
  std::vector<frame> path;
  entry* rn = find(root);
  if (!rn) return unregistered(file);
  rn->state = gray;
  rn->w = weight::of(root);
  path.push_back({&root, rn, 0});
  while (!path.empty()) {
    frame& f = path.back();
    const value* c = child(*f.v, f.next++);
    if (!c) {
      entry* finished = f.n;
      finished->state = done;
      path.pop_back();
      if (!path.empty()) {
        entry* p = path.back().n;
        p->w += finished->w;
        p->height = std::max(p->height, finished->height + 1);
        if (!p->w.within(budget_)) return too_big(file, p->offset);
      }
      continue;
    }
    if (!node_id(*c)) {
      f.n->w += weight::of(*c);
      if (!f.n->w.within(budget_)) return too_big(file, f.n->offset);
      continue;
    }
    entry* cn = find(*c);
    if (!cn) return unregistered(file);
    if (cn->state == gray)
      return format_detail::corrupt("pickle: reference cycle: a " + c->describe() +
                                        " (made by the opcode at this offset) contains itself",
                                    file, {}, cn->offset);
    if (cn->state == done) {  // shared: counted again, as a walker visits it again
      if (path.size() + cn->height > max_depth_) return too_deep(file, cn->offset);
      f.n->w += cn->w;
      f.n->height = std::max(f.n->height, cn->height + 1);
      if (!f.n->w.within(budget_)) return too_big(file, f.n->offset);
      continue;
    }
    if (path.size() + 1 > max_depth_) return too_deep(file, cn->offset);
    cn->state = gray;
    cn->w = weight::of(*c);
    path.push_back({c, cn, 0});
  }
  return ok();
}

CAIRN_INLINE std::size_t arena::slot(const void* id, unsigned bits) noexcept {
  auto h = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(id));
  return static_cast<std::size_t>((h * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

CAIRN_INLINE void arena::build_index() {
  bits_ = 4;
  while ((std::size_t{1} << bits_) < 2 * entries_.size()) ++bits_;
  index_.assign(std::size_t{1} << bits_, nullptr);
  const std::size_t mask = index_.size() - 1;
  for (entry& e : entries_)
    for (std::size_t i = slot(e.keep.get(), bits_);; i = (i + 1) & mask)
      if (!index_[i]) {
        index_[i] = &e;
        break;
      }
}

CAIRN_INLINE auto arena::find(const value& v) noexcept -> entry* {
  const void* id = node_id(v);
  const std::size_t mask = index_.size() - 1;
  for (std::size_t i = slot(id, bits_);; i = (i + 1) & mask) {
    if (!index_[i]) return nullptr;
    if (index_[i]->keep.get() == id) return index_[i];
  }
}

CAIRN_INLINE error arena::too_big(std::string_view file, std::uint64_t offset) const {
  return format_detail::fail(errc::resource,
                             "pickle: the value expands to more than " +
                                 std::to_string(budget_.nodes) + " nodes or " +
                                 std::to_string(budget_.bytes) +
                                 " string bytes when its shared parts are counted once per "
                                 "use (a memo bomb?)",
                             file, {}, offset);
}

}  // namespace cairn::pickle::detail

namespace cairn::pickle {

CAIRN_INLINE result<value> load(std::span<const std::byte> data,
                                std::string_view file,
                                const load_limits& limits) {
  using k = value::kind;
  const std::size_t n = data.size();
  auto bound = [&](std::uint64_t per_byte) {
    if (per_byte && n > (UINT64_MAX - limits.slack) / per_byte) return UINT64_MAX;
    return limits.slack + per_byte * n;
  };
  const detail::weight budget{bound(limits.nodes_per_byte), bound(limits.string_bytes_per_byte)};
  // Declared first, destroyed last: the stack and memo below only drop references.
  detail::arena ar(budget, limits.max_depth);
  std::size_t pos = 0, op_pos = 0;
  try {
    std::vector<value> stack;
    std::vector<std::size_t> marks;
    std::unordered_map<std::uint64_t, value> memo;
    auto err = [&](std::string msg) {
      return format_detail::corrupt("pickle: " + msg, file, {}, op_pos);
    };
    auto copied = [&](const value& v) { return ar.charge(v); };
    auto too_many_copies = [&] {
      return format_detail::fail(
          errc::resource,
          "pickle: memo and DUP copies exceed " + std::to_string(ar.budget().nodes) + " nodes or " +
              std::to_string(ar.budget().bytes) + " string bytes (a memo bomb?)",
          file, {}, op_pos);
    };
    // Every container is made through `fresh`, which registers it with the arena.
    auto fresh = [&](value v) {
      ar.add(v, op_pos);
      return v;
    };
    auto need = [&](std::size_t m) { return m <= n - pos; };
    auto u8at = [&](std::size_t p) { return std::to_integer<std::uint8_t>(data[p]); };
    auto pop = [&](value& out) {
      if (stack.empty() || (!marks.empty() && stack.size() <= marks.back())) return false;
      out = std::move(stack.back());
      stack.pop_back();
      return true;
    };
    auto pop_mark = [&](std::vector<value>& out) {
      if (marks.empty()) return false;
      std::size_t m = marks.back();
      marks.pop_back();
      out.assign(std::make_move_iterator(stack.begin() + static_cast<std::ptrdiff_t>(m)),
                 std::make_move_iterator(stack.end()));
      stack.resize(m);
      return true;
    };
    auto read_line = [&](std::string& out) {
      std::size_t e = pos;
      while (e < n && u8at(e) != '\n') ++e;
      if (e == n) return false;
      out.assign(reinterpret_cast<const char*>(data.data()) + pos, e - pos);
      pos = e + 1;
      return true;
    };
    auto read_str = [&](std::uint64_t len, std::string& out) {
      if (len > n - pos) return false;
      out.assign(reinterpret_cast<const char*>(data.data()) + pos, static_cast<std::size_t>(len));
      pos += static_cast<std::size_t>(len);
      return true;
    };
    auto read_uint = [&](std::size_t w, std::uint64_t& out) {
      if (!need(w)) return false;
      out = format_detail::load_le(data.data() + pos, w);
      pos += w;
      return true;
    };
    auto make_long = [&](std::string le) {
      // Fits in int64 when at most 8 bytes; sign-extend.
      if (le.empty()) return value::integer(0);
      if (le.size() <= 8) {
        std::uint64_t u = 0;
        for (std::size_t b = 0; b < le.size(); ++b)
          u |= std::uint64_t(static_cast<unsigned char>(le[b])) << (8 * b);
        if (le.size() < 8 && (static_cast<unsigned char>(le.back()) & 0x80))
          u |= ~std::uint64_t{0} << (8 * le.size());
        return value::integer(static_cast<std::int64_t>(u));
      }
      value v;
      v.type = k::big_integer;
      v.str = std::move(le);
      return v;
    };
    auto set_item = [](value& target, value key, value val) {
      if (target.type == k::dict)
        target.entries->emplace_back(std::move(key), std::move(val));
      else if (target.type == k::object)
        target.obj->dict_items.emplace_back(std::move(key), std::move(val));
      else
        return false;
      return true;
    };
    auto append = [](value& target, std::vector<value>& xs) {
      if (target.type == k::list || target.type == k::set)
        for (auto& x : xs) target.items->push_back(std::move(x));
      else if (target.type == k::object)
        for (auto& x : xs) target.obj->list_items.push_back(std::move(x));
      else
        return false;
      return true;
    };
    auto call = [&](value callable, value args, bool newobj) -> result<value> {
      if (callable.type == k::global)
        return fresh(value::instance(std::move(callable.str), std::move(callable.name),
                                     std::move(args), value(), newobj));
      if (callable.type == k::object)  // e.g. a bound method; keep its description
        return fresh(value::instance(callable.obj->module, callable.obj->name, std::move(args),
                                     value(), newobj));
      return err("cannot call a " + callable.describe());
    };

    while (true) {
      op_pos = pos;
      if (pos >= n) return err("truncated: no STOP opcode");
      std::uint8_t op = u8at(pos++);
      std::string s;
      std::uint64_t u = 0;
      value a, b, c;
      std::vector<value> xs;
      switch (op) {
        case 0x80:  // PROTO
          if (!read_uint(1, u)) return err("truncated PROTO");
          if (u > 5) return err("unsupported protocol " + std::to_string(u));
          break;
        case 0x95:  // FRAME
          if (!read_uint(8, u)) return err("truncated FRAME");
          break;
        case '.': {  // STOP
          if (stack.size() != 1 || !marks.empty()) return err("STOP with a malformed stack");
          value root = std::move(stack.back());
          CAIRN_TRY(ar.check(root, file));
          return root;
        }
        case '(':  // MARK
          marks.push_back(stack.size());
          break;
        case '0':  // POP
          if (!pop(a)) {
            if (marks.empty() || stack.size() != marks.back()) return err("POP on an empty stack");
            marks.pop_back();
          }
          break;
        case '1':  // POP_MARK
          if (!pop_mark(xs)) return err("POP_MARK without MARK");
          break;
        case '2':  // DUP
          if (stack.empty()) return err("DUP on an empty stack");
          if (!copied(stack.back())) return too_many_copies();
          stack.push_back(stack.back());
          break;
        case 'N':
          stack.push_back(value::none());
          break;
        case 0x88:
          stack.push_back(value::boolean(true));
          break;
        case 0x89:
          stack.push_back(value::boolean(false));
          break;
        case 'J':  // BININT
          if (!read_uint(4, u)) return err("truncated BININT");
          stack.push_back(value::integer(static_cast<std::int32_t>(static_cast<std::uint32_t>(u))));
          break;
        case 'K':  // BININT1
          if (!read_uint(1, u)) return err("truncated BININT1");
          stack.push_back(value::integer(static_cast<std::int64_t>(u)));
          break;
        case 'M':  // BININT2
          if (!read_uint(2, u)) return err("truncated BININT2");
          stack.push_back(value::integer(static_cast<std::int64_t>(u)));
          break;
        case 0x8a:  // LONG1
        case 0x8b:  // LONG4
          if (!read_uint(op == 0x8a ? 1 : 4, u) || !read_str(u, s)) return err("truncated LONG");
          stack.push_back(make_long(std::move(s)));
          break;
        case 'I':  // INT (protocol 0): "01"/"00" are booleans
        case 'L':  // LONG (protocol 0)
          if (!read_line(s)) return err("truncated INT");
          if (!s.empty() && s.back() == 'L') s.pop_back();
          if (op == 'I' && (s == "00" || s == "01")) {
            stack.push_back(value::boolean(s == "01"));
          } else {
            try {
              stack.push_back(value::integer(std::stoll(s)));
            } catch (const std::logic_error&) {  // invalid_argument, out_of_range
              return err("bad integer literal '" + s.substr(0, 64) + "'");
            }
          }
          break;
        case 'G': {  // BINFLOAT, big-endian
          if (!need(8)) return err("truncated BINFLOAT");
          std::uint64_t bits = 0;
          for (int q = 0; q < 8; ++q) bits = (bits << 8) | u8at(pos + q);
          pos += 8;
          stack.push_back(value::floating(std::bit_cast<double>(bits)));
          break;
        }
        case 'F':  // FLOAT (protocol 0)
          if (!read_line(s)) return err("truncated FLOAT");
          try {
            stack.push_back(value::floating(std::stod(s)));
          } catch (const std::logic_error&) {
            return err("bad float literal");
          }
          break;
        case 'X':    // BINUNICODE
        case 0x8c:   // SHORT_BINUNICODE
        case 0x8d:   // BINUNICODE8
        case 'T':    // BINSTRING (Python 2 str)
        case 'U': {  // SHORT_BINSTRING
          std::size_t w = (op == 0x8c || op == 'U') ? 1 : op == 0x8d ? 8 : 4;
          if (!read_uint(w, u) || !read_str(u, s)) return err("truncated string");
          stack.push_back(value::string(std::move(s)));
          break;
        }
        case 'B':     // BINBYTES
        case 'C':     // SHORT_BINBYTES
        case 0x8e:    // BINBYTES8
        case 0x96: {  // BYTEARRAY8
          std::size_t w = op == 'C' ? 1 : op == 'B' ? 4 : 8;
          if (!read_uint(w, u) || !read_str(u, s)) return err("truncated bytes");
          stack.push_back(value::bytes(std::move(s)));
          break;
        }
        case ']':  // EMPTY_LIST
          stack.push_back(fresh(value::list()));
          break;
        case ')':  // EMPTY_TUPLE
          stack.push_back(fresh(value::tuple()));
          break;
        case '}':  // EMPTY_DICT
          stack.push_back(fresh(value::dict()));
          break;
        case 0x8f:  // EMPTY_SET
          stack.push_back(fresh(value::sequence(k::set)));
          break;
        case 'l':   // LIST
        case 't':   // TUPLE
        case 0x91:  // FROZENSET
          if (!pop_mark(xs)) return err("LIST/TUPLE/FROZENSET without MARK");
          stack.push_back(fresh(value::sequence(op == 'l'   ? k::list
                                                : op == 't' ? k::tuple
                                                            : k::frozenset,
                                                std::move(xs))));
          break;
        case 0x85:    // TUPLE1
        case 0x86:    // TUPLE2
        case 0x87: {  // TUPLE3
          std::size_t cnt = op - 0x84u;
          if (stack.size() < cnt || (!marks.empty() && stack.size() - cnt < marks.back()))
            return err("TUPLEn with too few items");
          xs.assign(std::make_move_iterator(stack.end() - static_cast<std::ptrdiff_t>(cnt)),
                    std::make_move_iterator(stack.end()));
          stack.resize(stack.size() - cnt);
          stack.push_back(fresh(value::tuple(std::move(xs))));
          break;
        }
        case 'd':  // DICT
          if (!pop_mark(xs) || xs.size() % 2) return err("DICT without MARK or with odd items");
          a = fresh(value::dict());
          for (std::size_t q = 0; q < xs.size(); q += 2)
            a.entries->emplace_back(std::move(xs[q]), std::move(xs[q + 1]));
          stack.push_back(std::move(a));
          break;
        case 'a':  // APPEND
          if (!pop(a) || stack.empty()) return err("APPEND on a short stack");
          xs.push_back(std::move(a));
          if (!append(stack.back(), xs)) return err("APPEND to a " + stack.back().describe());
          break;
        case 'e':   // APPENDS
        case 0x90:  // ADDITEMS
          if (!pop_mark(xs) || stack.empty()) return err("APPENDS/ADDITEMS without MARK");
          if (!append(stack.back(), xs)) return err("APPENDS to a " + stack.back().describe());
          break;
        case 's':  // SETITEM
          if (!pop(b) || !pop(a) || stack.empty()) return err("SETITEM on a short stack");
          if (!set_item(stack.back(), std::move(a), std::move(b)))
            return err("SETITEM on a " + stack.back().describe());
          break;
        case 'u':  // SETITEMS
          if (!pop_mark(xs) || xs.size() % 2 || stack.empty()) return err("SETITEMS malformed");
          for (std::size_t q = 0; q < xs.size(); q += 2)
            if (!set_item(stack.back(), std::move(xs[q]), std::move(xs[q + 1])))
              return err("SETITEMS on a " + stack.back().describe());
          break;
        case 'c': {  // GLOBAL
          std::string mod;
          if (!read_line(mod) || !read_line(s)) return err("truncated GLOBAL");
          stack.push_back(value::global(std::move(mod), std::move(s)));
          break;
        }
        case 0x93:  // STACK_GLOBAL
          if (!pop(b) || !pop(a) || a.type != k::string || b.type != k::string)
            return err("STACK_GLOBAL needs two strings");
          stack.push_back(value::global(std::move(a.str), std::move(b.str)));
          break;
        case 'R':     // REDUCE
        case 0x81: {  // NEWOBJ
          if (!pop(b) || !pop(a)) return err("REDUCE/NEWOBJ on a short stack");
          CAIRN_TRY_ASSIGN(value v, call(std::move(a), std::move(b), op == 0x81));
          stack.push_back(std::move(v));
          break;
        }
        case 0x92: {  // NEWOBJ_EX: cls, args, kwargs
          if (!pop(c) || !pop(b) || !pop(a)) return err("NEWOBJ_EX on a short stack");
          CAIRN_TRY_ASSIGN(value v, call(std::move(a), std::move(b), true));
          if (!c.is_none() && !(c.is_dict() && c.entries->empty())) v.obj->state = std::move(c);
          stack.push_back(std::move(v));
          break;
        }
        case 'b': {  // BUILD
          if (!pop(b) || stack.empty()) return err("BUILD on a short stack");
          value& target = stack.back();
          if (target.type == k::object) {
            target.obj->state = std::move(b);
          } else if (target.type == k::global) {
            // BUILD on a class reference (rare); turn it into an object to keep the state.
            target = fresh(value::instance(std::move(target.str), std::move(target.name),
                                           fresh(value::tuple()), std::move(b), true));
          } else if (target.type == k::dict && b.is_dict()) {
            // `target.update(state)` (CPython itself refuses BUILD on a plain dict). A dict
            // updated with itself is unchanged; otherwise the state's entries are copied
            // first, so growing `target` never invalidates what is being read.
            if (b.entries == target.entries) break;
            std::vector<std::pair<value, value>> es;
            es.reserve(b.entries->size());
            for (const auto& e : *b.entries) {
              if (!copied(e.first) || !copied(e.second)) return too_many_copies();
              es.push_back(e);
            }
            for (auto& e : es) target.entries->push_back(std::move(e));
          } else {
            return err("BUILD on a " + target.describe());
          }
          break;
        }
        case 'Q':  // BINPERSID
          if (!pop(a)) return err("BINPERSID on an empty stack");
          stack.push_back(fresh(value::persistent(std::move(a))));
          break;
        case 'P':  // PERSID
          if (!read_line(s)) return err("truncated PERSID");
          stack.push_back(fresh(value::persistent(value::string(std::move(s)))));
          break;
        case 'q':  // BINPUT
        case 'r':  // LONG_BINPUT
        case 'p':  // PUT
          if (op == 'p') {
            if (!read_line(s)) return err("truncated PUT");
            u = std::strtoull(s.c_str(), nullptr, 10);
          } else if (!read_uint(op == 'q' ? 1 : 4, u)) {
            return err("truncated BINPUT");
          }
          if (stack.empty()) return err("PUT on an empty stack");
          if (!copied(stack.back())) return too_many_copies();
          memo[u] = stack.back();
          break;
        case 0x94:  // MEMOIZE
          if (stack.empty()) return err("MEMOIZE on an empty stack");
          if (!copied(stack.back())) return too_many_copies();
          memo[memo.size()] = stack.back();
          break;
        case 'h':    // BINGET
        case 'j':    // LONG_BINGET
        case 'g': {  // GET
          if (op == 'g') {
            if (!read_line(s)) return err("truncated GET");
            u = std::strtoull(s.c_str(), nullptr, 10);
          } else if (!read_uint(op == 'h' ? 1 : 4, u)) {
            return err("truncated BINGET");
          }
          auto it = memo.find(u);
          if (it == memo.end()) return err("GET of unknown memo index " + std::to_string(u));
          if (!copied(it->second)) return too_many_copies();
          stack.push_back(it->second);
          break;
        }
        default: {
          static constexpr char hex[] = "0123456789abcdef";
          std::string h = "0x";
          h.push_back(hex[op >> 4]);
          h.push_back(hex[op & 15]);
          return err("unsupported opcode " + h);
        }
      }
    }
  } catch (const std::bad_alloc&) {
    return format_detail::fail(errc::resource, "pickle: out of memory", file, {}, op_pos);
  } catch (const std::length_error&) {
    return format_detail::fail(errc::resource, "pickle: out of memory", file, {}, op_pos);
  }
}

CAIRN_INLINE writer::writer(int protocol) : protocol_(protocol) {
  out_.push_back(static_cast<char>(0x80));
  out_.push_back(static_cast<char>(protocol));
}

CAIRN_INLINE void writer::dump(const value& v) {
  using k = value::kind;
  switch (v.type) {
    case k::none:
      op('N');
      break;
    case k::boolean:
      op(v.i ? 0x88 : 0x89);
      break;
    case k::integer:
      integer(v.i);
      break;
    case k::big_integer:
      op(0x8b);
      format_detail::put_le(out_, v.str.size(), 4);
      out_ += v.str;
      break;
    case k::floating: {
      op('G');
      auto bits = std::bit_cast<std::uint64_t>(v.f);
      for (int q = 7; q >= 0; --q) out_.push_back(static_cast<char>((bits >> (8 * q)) & 0xff));
      break;
    }
    case k::string:
      string(v.str);
      break;
    case k::bytes:
      if (protocol_ >= 3) {
        op('B');
        format_detail::put_le(out_, v.str.size(), 4);
        out_ += v.str;
      } else {
        global("_codecs", "encode");
        std::string latin1;  // each byte as a code point, UTF-8 encoded
        for (unsigned char ch : v.str) {
          if (ch < 0x80) {
            latin1.push_back(static_cast<char>(ch));
          } else {
            latin1.push_back(static_cast<char>(0xc0 | (ch >> 6)));
            latin1.push_back(static_cast<char>(0x80 | (ch & 0x3f)));
          }
        }
        string(latin1);
        string("latin1");
        op(0x86);
        op('R');
      }
      break;
    case k::list:
      op(']');
      if (!v.elements().empty()) {
        op('(');
        for (const auto& x : v.elements()) dump(x);
        op('e');
      }
      break;
    case k::tuple:
      tuple(v.elements());
      break;
    case k::set:
    case k::frozenset:
      if (v.type == k::set && protocol_ >= 4) {
        op(0x8f);
        if (!v.elements().empty()) {
          op('(');
          for (const auto& x : v.elements()) dump(x);
          op(0x90);
        }
      } else {
        global("builtins", v.type == k::set ? "set" : "frozenset");
        dump(value::list(v.elements()));
        op(0x85);
        op('R');
      }
      break;
    case k::dict:
      op('}');
      if (v.entries && !v.entries->empty()) {
        op('(');
        for (const auto& [key, val] : *v.entries) {
          dump(key);
          dump(val);
        }
        op('u');
      }
      break;
    case k::global:
      global(v.str, v.name);
      break;
    case k::object: {
      const object& o = *v.obj;
      global(o.module, o.name);
      if (o.args.type == k::tuple)
        dump(o.args);
      else
        tuple({o.args});
      op(o.newobj ? 0x81 : 'R');
      if (!o.state.is_none()) {
        dump(o.state);
        op('b');
      }
      if (!o.list_items.empty()) {
        op('(');
        for (const auto& x : o.list_items) dump(x);
        op('e');
      }
      if (!o.dict_items.empty()) {
        op('(');
        for (const auto& [key, val] : o.dict_items) {
          dump(key);
          dump(val);
        }
        op('u');
      }
      break;
    }
    case k::persistent_id:
      dump(v.elements().empty() ? value::none() : v.elements()[0]);
      op('Q');
      break;
  }
}

CAIRN_INLINE void writer::integer(std::int64_t x) {
  if (x >= 0 && x < 256) {
    op('K');
    put(x, 1);
  } else if (x >= 0 && x < 65536) {
    op('M');
    put(x, 2);
  } else if (x >= INT32_MIN && x <= INT32_MAX) {
    op('J');
    put(static_cast<std::uint32_t>(static_cast<std::int32_t>(x)), 4);
  } else {
    // LONG1: minimal two's complement little-endian bytes.
    std::string b;
    auto u = static_cast<std::uint64_t>(x);
    for (int q = 0; q < 8; ++q) b.push_back(static_cast<char>((u >> (8 * q)) & 0xff));
    while (b.size() > 1) {
      auto last = static_cast<unsigned char>(b.back());
      auto prev = static_cast<unsigned char>(b[b.size() - 2]);
      if ((last == 0 && !(prev & 0x80)) || (last == 0xff && (prev & 0x80)))
        b.pop_back();
      else
        break;
    }
    op(0x8a);
    put(b.size(), 1);
    out_ += b;
  }
}

CAIRN_INLINE void writer::string(std::string_view s) {
  if (protocol_ >= 4 && s.size() < 256) {
    op(0x8c);
    put(s.size(), 1);
  } else {
    op('X');
    put(s.size(), 4);
  }
  out_ += s;
}

CAIRN_INLINE void writer::global(std::string_view module, std::string_view name) {
  op('c');
  out_ += module;
  out_.push_back('\n');
  out_ += name;
  out_.push_back('\n');
}

CAIRN_INLINE void writer::tuple(const std::vector<value>& xs) {
  if (xs.empty()) {
    op(')');
    return;
  }
  if (xs.size() > 3) op('(');
  for (const auto& x : xs) dump(x);
  op(xs.size() == 1 ? 0x85 : xs.size() == 2 ? 0x86 : xs.size() == 3 ? 0x87 : 't');
}

CAIRN_INLINE std::string writer::finish() && {
  op('.');
  return std::move(out_);
}

CAIRN_INLINE std::string dumps(const value& v, int protocol) {
  writer w(protocol);
  w.dump(v);
  return std::move(w).finish();
}

}  // namespace cairn::pickle
