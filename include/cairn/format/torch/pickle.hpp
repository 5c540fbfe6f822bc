// cairn/format/torch/pickle.hpp: a Python pickle reader (protocols 0-5, the binary opcodes
// torch.save and PyTorch DCP use) producing a generic value tree, and a writer for the values cairn
// emits. No class is ever executed: GLOBAL/REDUCE/NEWOBJ/BUILD become `object` nodes that keep the
// module, name, arguments and state, so unknown classes and extra fields are tolerated.
// The reader is safe on hostile input: it never throws, rejects results that contain themselves,
// nest too deep or expand (through memo sharing) far beyond the input (`load_limits`), and frees
// everything it built, cycles and million-deep nests included, without recursion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/detail/config.hpp"
#include "cairn/format/detail/format_util.hpp"

namespace cairn::pickle {

struct object;

/// A node of an unpickled value tree. Containers and objects have reference semantics (shared),
/// as in Python: a memoized list that is appended to later is the same list everywhere.
struct value {
  /// What a value holds.
  enum class kind {
    none,
    boolean,
    integer,      ///< fits in int64 (`i`)
    big_integer,  ///< larger LONG1/LONG4: little-endian two's complement bytes in `str`
    floating,
    string,         ///< UTF-8 in `str`
    bytes,          ///< raw bytes in `str`
    list,           ///< `items`
    tuple,          ///< `items`
    dict,           ///< `entries`, in insertion order
    set,            ///< `items`
    frozenset,      ///< `items`
    global,         ///< a class or function reference: `str` = module, `name` = qualified name
    object,         ///< the result of REDUCE / NEWOBJ (+ BUILD): `obj`
    persistent_id,  ///< BINPERSID / PERSID: the id in `items[0]`
  };
  kind type = kind::none;
  std::int64_t i = 0;
  double f = 0;
  std::string str;
  std::string name;
  std::shared_ptr<std::vector<value>> items;
  std::shared_ptr<std::vector<std::pair<value, value>>> entries;
  std::shared_ptr<pickle::object> obj;

  // --- construction ---
  /// None.
  static value none() { return {}; }
  /// True or False.
  static value boolean(bool b);
  /// An int.
  static value integer(std::int64_t x);
  /// A float.
  static value floating(double x);
  /// A str.
  static value string(std::string s);
  /// A bytes object.
  static value bytes(std::string b);
  /// A list, tuple, set or frozenset of `xs`.
  static value sequence(kind k, std::vector<value> xs = {});
  /// A list.
  static value list(std::vector<value> xs = {}) { return sequence(kind::list, std::move(xs)); }
  /// A tuple.
  static value tuple(std::vector<value> xs = {}) { return sequence(kind::tuple, std::move(xs)); }
  /// A dict with entries in the given order.
  static value dict(std::vector<std::pair<value, value>> es = {});
  /// A reference to `module.name` (a class, function or singleton like `torch.float32`).
  static value global(std::string module, std::string name);
  /// A persistent id wrapping `pid`.
  static value persistent(value pid);
  /// An instance of `module.name` (see `pickle::object`).
  static value instance(std::string module, std::string name, value args, value state, bool newobj);
  /// An instance created with NEWOBJ and no state.
  static value instance(std::string module, std::string name, value args);

  // --- inspection ---
  bool is_none() const noexcept { return type == kind::none; }
  bool is_int() const noexcept { return type == kind::integer || type == kind::boolean; }
  bool is_string() const noexcept { return type == kind::string; }
  bool is_dict() const noexcept { return type == kind::dict; }
  /// True for list and tuple.
  bool is_sequence() const noexcept { return type == kind::list || type == kind::tuple; }
  bool is_object() const noexcept { return type == kind::object; }
  bool is_global(std::string_view module, std::string_view n) const noexcept {
    return type == kind::global && str == module && name == n;
  }
  /// Elements of a list/tuple/set (empty for other kinds).
  const std::vector<value>& elements() const noexcept;
  /// The value under string key `key` of a dict, or nullptr.
  const value* get(std::string_view key) const noexcept;
  /// A short description of the kind for error messages, e.g. "tuple" or "object torch.Size".
  std::string describe() const;
};

/// An instance built by REDUCE (`callable(*args)`) or NEWOBJ (`cls.__new__(cls, *args)`),
/// with the state BUILD gave it and items APPENDS/SETITEMS added to it.
struct object {
  std::string module;   ///< module of the class or callable ("" when the callable was no global)
  std::string name;     ///< its qualified name
  value args;           ///< the argument tuple
  value state;          ///< BUILD's argument (None when there was no BUILD)
  bool newobj = false;  ///< NEWOBJ rather than REDUCE
  std::vector<value> list_items;                    ///< APPEND(S) onto the object
  std::vector<std::pair<value, value>> dict_items;  ///< SETITEM(S) onto the object

  /// True when the class is `module.name`.
  bool is(std::string_view m, std::string_view n) const noexcept {
    return module == m && name == n;
  }
  /// Attribute `attr` from the state: a dict state, or the slots dict of a `(dict, slots)` state.
  const value* attr(std::string_view attr) const noexcept;
};

/// What `load` accepts. A pickle is a small program that can share one node many times (memo
/// `GET`, `DUP`), so a few bytes can describe a reference cycle, a very deep nest or a tree far
/// larger than the file. `load` rejects those, so that code walking a loaded value, recursively
/// or not, does work bounded by the size of the file.
///
/// The size of a result is counted *expanded*: a node shared by several parents counts once per
/// parent, as a walker visits it once per parent. Real files stay far below the defaults: a DCP
/// `.metadata` or a `torch.save` pickle has about 0.3 nodes and 2 string bytes per byte of
/// input, a list of one 40-character string repeated by memo reference about 20 string bytes.
struct load_limits {
  /// Deepest nesting of containers (list, tuple, dict, set, object, persistent id). A DCP
  /// `.metadata` nests about 12 deep, a `torch.save` pickle about 8.
  std::size_t max_depth = 256;
  /// Most nodes in the expanded result per byte of input (plus `slack`).
  std::uint64_t nodes_per_byte = 16;
  /// Most string bytes (str, bytes, names of globals and classes) in the expanded result per
  /// byte of input (plus `slack`). Also bounds what `GET`, `DUP`, `PUT` and `BUILD` copy.
  std::uint64_t string_bytes_per_byte = 64;
  /// Added to both bounds, so that small files are never refused for their size.
  std::uint64_t slack = std::uint64_t{1} << 20;
};

namespace detail {

/// The identity of the container `v` holds (its shared storage), or nullptr for a scalar.
CAIRN_INLINE const void* node_id(const value& v) noexcept;

/// The `i`-th child of container `v` (dict: key, value, key, ...; object: args, state, list
/// items, dict items), or nullptr past the last.
CAIRN_INLINE const value* child(const value& v, std::size_t i) noexcept;

/// Nodes and string bytes, saturating.
struct weight {
  std::uint64_t nodes = 0, bytes = 0;
  /// One copy of `v` itself (a container's children are shared, not copied).
  static weight of(const value& v) noexcept;
  weight& operator+=(const weight& o) noexcept;
  bool within(const weight& limit) const noexcept {
    return nodes <= limit.nodes && bytes <= limit.bytes;
  }
};

/// Every container one `load` creates. It owns a reference to each, so dropping the stack, the
/// memo or a container's children never destroys a container, and it tears them down in a flat
/// loop (children first dropped while it still owns everything): no destructor recursion on a
/// deep nest, no leak through a reference cycle. `check` verifies the result and marks what it
/// reaches; everything else (a failed load, the unreachable rest of a good one) is torn down.
class arena {
 public:
  arena(weight budget, std::size_t max_depth) : budget_(budget), max_depth_(max_depth) {}
  arena(const arena&) = delete;
  arena& operator=(const arena&) = delete;
  ~arena();

  /// Registers a container created by the opcode at byte `offset` (no-op for a scalar).
  void add(const value& v, std::uint64_t offset);

  /// Counts a copy of `v` against the budget; false once it is spent.
  bool charge(const value& v) noexcept;
  const weight& budget() const noexcept { return budget_; }

  /// Checks the value under `root`: no container contains itself, nesting is at most
  /// `max_depth`, and the expanded size is within budget. Iterative (no recursion); each
  /// container is visited once.
  result<void> check(const value& root, std::string_view file);

 private:
  enum : std::uint8_t { white, gray, done };  // done: reached from the result and checked
  struct entry {
    std::shared_ptr<void> keep;  ///< the container (vector of values or pairs, or object)
    std::uint64_t offset = 0;    ///< of the opcode that made it
    weight w;                    ///< expanded size (once done)
    std::uint32_t height = 1;    ///< containers on the longest path down, this one included
    value::kind type = value::kind::list;
    std::uint8_t state = white;
  };
  // An open-addressing table from a container's address to its entry, built once by `check`.
  static std::size_t slot(const void* id, unsigned bits) noexcept;
  void build_index();
  entry* find(const value& v) noexcept;
  error too_big(std::string_view file, std::uint64_t offset) const;
  error too_deep(std::string_view file, std::uint64_t offset) const {
    return format_detail::fail(errc::resource,
                               "pickle: containers nest deeper than " + std::to_string(max_depth_),
                               file, {}, offset);
  }
  static error unregistered(std::string_view file) {
    return format_detail::fail(errc::invalid_argument, "pickle: internal: unregistered node", file);
  }

  weight budget_;
  std::size_t max_depth_;
  weight copied_;
  std::vector<entry> entries_;
  std::vector<entry*> index_;
  unsigned bits_ = 0;
};

}  // namespace detail

/// Unpickles `data`. `file` names the source in errors, which carry the byte offset of the
/// failing opcode. Unsupported opcodes (EXT*, out-of-band buffers) and malformed input, including
/// a result that contains itself (a reference cycle), are `errc::corrupt` errors; a result
/// beyond `limits` (too deep, or a memo bomb) or running out of memory is `errc::resource`.
/// Never throws; memory and time are bounded by `limits` and the size of `data`.
CAIRN_INLINE result<value> load(std::span<const std::byte> data,
                                std::string_view file = {},
                                const load_limits& limits = {});

/// Emits pickle opcodes. `dump(value)` serializes a whole value tree; the low-level calls let a
/// writer stream large structures. Output is deterministic (no memo is used).
class writer {
 public:
  /// Starts a pickle of protocol `protocol` (2-5). Protocol 2 writes bytes as
  /// `_codecs.encode(str, 'latin1')` as Python does; 3+ uses BINBYTES.
  explicit writer(int protocol = 2);

  /// Serializes `v` (see `value`); `object` nodes become GLOBAL + NEWOBJ or REDUCE, then BUILD
  /// when the state is not None, then APPENDS/SETITEMS of their items.
  void dump(const value& v);

  /// Emits one raw opcode byte.
  void op(int code) { out_.push_back(static_cast<char>(code)); }
  /// Emits an int with the smallest opcode (BININT1/BININT2/BININT/LONG1).
  void integer(std::int64_t x);
  /// Emits a str (BINUNICODE, or SHORT_BINUNICODE from protocol 4).
  void string(std::string_view s);
  /// Emits `module.name` with GLOBAL (valid in every protocol).
  void global(std::string_view module, std::string_view name);
  /// Emits a tuple of `xs` (EMPTY_TUPLE, TUPLE1-3 or MARK ... TUPLE).
  void tuple(const std::vector<value>& xs);
  /// Ends the pickle (STOP) and returns its bytes.
  std::string finish() &&;

 private:
  void put(std::uint64_t v, std::size_t w) { format_detail::put_le(out_, v, w); }
  int protocol_;
  std::string out_;
};

/// Pickles one value with the given protocol.
CAIRN_INLINE std::string dumps(const value& v, int protocol = 2);

}  // namespace cairn::pickle

#if CAIRN_HEADER_ONLY
#  include "cairn/format/torch/pickle-inl.hpp"
#endif
