// tests/system/hostile/bounded.hpp: runs one hostile-input case in a forked child under a memory
// and a wall-clock limit and says how it ended — a clear cairn error, success, another exception, a
// crash, a timeout, running out of memory or (under LeakSanitizer) a leak — so that a test can
// assert "this input ends in a clear error within bounded time and memory" without the case
// being able to take the test program down with it.
//
//   #include "tests/system/hostile/bounded.hpp"
//   TEST_CASE("a memo bomb is refused") {
//     auto r = cairn_hostile::run_bounded([&] { return cairn::dcp::decode(bomb, ".metadata"); });
//     CHECK_MESSAGE(r.clear_error(), r.describe());         // ended in a cairn error, in bounds
//     CHECK(r.code == cairn::errc::resource);
//   }
//
// The case is any callable returning `cairn::result<T>` (a clear error is a result holding an
// error) or anything else (a clear error is a thrown `cairn::exception`; returning is success).
// Limits (`bounds`):
// - memory: without a sanitizer the child runs under `setrlimit(RLIMIT_AS)` at the address
//   space it inherited plus `memory_bytes` (what a program that initialized the CUDA driver or
//   ran many threads holds varies by machine: tens of GiB reserved on a GPU machine), so a
//   runaway allocation fails (std::bad_alloc, reported as out of memory) instead of swapping the
//   machine; under AddressSanitizer / ThreadSanitizer (which reserve terabytes of address
//   space) no rlimit is set, and the child's peak resident set (getrusage) is checked instead.
//   Either way a peak RSS above the limit is reported as out of memory.
// - time: `alarm()` in the child; a child still running is killed by SIGALRM (timed out).
// - leaks: under AddressSanitizer the case runs on a thread of the child and LeakSanitizer
//   checks afterwards (`outcome::leaked`), so a reader that leaks on hostile input fails even
//   when it reports the right error.
// A sanitizer's own report (heap-use-after-free, stack overflow, UB) makes the child exit with
// status 1 (`outcome::exited`); its text is on the test's stderr.
// The child inherits the test program's memory copy-on-write, so the callable may capture
// inputs by reference. It must not use doctest assertions (they would be lost in the child).
// Fork the test program only while it runs no other threads (doctest runs cases on one).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "cairn/core/error.hpp"

#if defined(__has_feature)
#  if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
      __has_feature(memory_sanitizer)
#    define CAIRN_HOSTILE_SANITIZED 1
#  endif
#  if __has_feature(address_sanitizer)
#    define CAIRN_HOSTILE_LSAN 1
#  endif
#endif
#if !defined(CAIRN_HOSTILE_SANITIZED) && \
    (defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__))
#  define CAIRN_HOSTILE_SANITIZED 1
#endif
#if !defined(CAIRN_HOSTILE_LSAN) && defined(__SANITIZE_ADDRESS__)
#  define CAIRN_HOSTILE_LSAN 1
#endif
#ifndef CAIRN_HOSTILE_SANITIZED
#  define CAIRN_HOSTILE_SANITIZED 0
#endif
#ifdef CAIRN_HOSTILE_LSAN
#  include <sanitizer/lsan_interface.h>
#endif

namespace cairn_hostile {

/// True when built with a sanitizer: no address-space limit, peak RSS is checked instead.
inline constexpr bool sanitized = CAIRN_HOSTILE_SANITIZED != 0;

/// The limits a case runs under.
struct bounds {
  /// Address space the case may add (RLIMIT_AS, unsanitized builds) and peak resident set
  /// (all builds).
  std::uint64_t memory_bytes = std::uint64_t{2} << 30;
  /// Wall-clock seconds before the child is killed.
  unsigned seconds = 60;
};

/// How a case ended.
enum class outcome {
  clear_error,      ///< returned an error result, or threw `cairn::exception`
  succeeded,        ///< returned a value (or returned normally)
  other_exception,  ///< threw something other than `cairn::exception` / std::bad_alloc
  out_of_memory,    ///< threw std::bad_alloc, or its peak RSS passed the limit
  leaked,           ///< ended, but LeakSanitizer found memory nothing points to
  crashed,          ///< killed by a signal (other than the timeout's SIGALRM)
  exited,           ///< exited abnormally (a sanitizer report, std::terminate, exit())
  timed_out,        ///< still running after `bounds::seconds`
};

/// A short name for an outcome: "clear cairn error", "crashed (signal)", ...
inline const char* outcome_name(outcome o) noexcept {
  switch (o) {
    case outcome::clear_error:
      return "clear cairn error";
    case outcome::succeeded:
      return "succeeded";
    case outcome::other_exception:
      return "threw a non-cairn exception";
    case outcome::out_of_memory:
      return "ran out of memory";
    case outcome::leaked:
      return "leaked memory";
    case outcome::crashed:
      return "crashed (signal)";
    case outcome::exited:
      return "exited abnormally";
    case outcome::timed_out:
      return "timed out";
  }
  return "?";
}

/// What `run_bounded` saw.
struct report {
  outcome what = outcome::crashed;
  cairn::errc code = cairn::errc::io;  ///< the error's code, for clear_error
  std::string detail;   ///< the error's describe(), an exception's what(), a signal's name
  int signal = 0;       ///< for crashed / timed_out
  int exit_status = 0;  ///< for exited
  double seconds = 0;   ///< wall clock the child ran
  std::uint64_t peak_rss_bytes = 0;  ///< the child's peak resident set
  bounds limits;

  /// True when the case ended in a cairn error within the limits.
  bool clear_error() const noexcept { return what == outcome::clear_error; }
  /// One line for a test message: outcome, detail, time and memory.
  std::string describe() const {
    std::string s = outcome_name(what);
    if (!detail.empty()) s += ": " + detail;
    if (what == outcome::exited) s += " (status " + std::to_string(exit_status) + ")";
    char buf[128];
    std::snprintf(buf, sizeof buf, " [%.2f s of %u, peak RSS %.0f MiB of %.0f MiB%s]", seconds,
                  limits.seconds, static_cast<double>(peak_rss_bytes) / (1 << 20),
                  static_cast<double>(limits.memory_bytes) / (1 << 20),
                  sanitized ? ", sanitized: no rlimit" : "");
    return s + buf;
  }
};

namespace detail {

// What the child writes to the pipe: one tag byte, the errc (for 'E') and a message.
inline void child_send(int fd, char tag, int code, const std::string& msg) noexcept {
  std::string out(1, tag);
  out += std::to_string(code);
  out += '\n';
  out.append(msg, 0, 4000);
  const char* p = out.data();
  std::size_t left = out.size();
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    p += w;
    left -= static_cast<std::size_t>(w);
  }
}

template <class T>
struct is_result : std::false_type {};
template <class T>
struct is_result<cairn::result<T>> : std::true_type {};

// The address space this process has mapped (/proc/self/statm), 0 when it cannot be read.
inline std::uint64_t inherited_address_space() noexcept {
  int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[64] = {};
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  return std::strtoull(buf, nullptr, 10) * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

// Runs the case in the child and reports through `fd`; never returns.
template <class F>
[[noreturn]] void child_main(int fd, F& fn, const bounds& b) noexcept {
  if (!sanitized) {
    struct rlimit lim;
    lim.rlim_cur = lim.rlim_max = static_cast<rlim_t>(inherited_address_space() + b.memory_bytes);
    ::setrlimit(RLIMIT_AS, &lim);
  }
  ::alarm(b.seconds);
  char tag = 'S';
  int code = 0;
  std::string msg;
  auto run = [&] {
    try {
      using R = std::invoke_result_t<F&>;
      if constexpr (is_result<std::remove_cvref_t<R>>::value) {
        auto r = fn();
        if (!r) {
          tag = 'E';
          code = static_cast<int>(r.err().code);
          msg = r.err().describe();
        }
      } else {
        fn();
      }
    } catch (const cairn::exception& e) {
      tag = 'E';
      code = static_cast<int>(e.err().code);
      msg = e.err().describe();
    } catch (const std::bad_alloc&) {
      tag = 'M';
      msg = "std::bad_alloc";
    } catch (const std::exception& e) {
      tag = 'X';
      msg = e.what();
    } catch (...) {
      tag = 'X';
      msg = "an exception of unknown type";
    }
  };
#ifdef CAIRN_HOSTILE_LSAN
  // On a thread of its own, whose stack is gone by the leak check: stale pointers left in
  // dead stack frames would otherwise hide what the case leaked.
  std::thread(run).join();
#else
  run();
#endif
#ifdef CAIRN_HOSTILE_LSAN
  // Everything the case allocated is unreachable by now unless it leaked (the parent's own
  // memory, inherited, is still referenced from its stack and globals).
  if (__lsan_do_recoverable_leak_check() != 0) {
    msg = std::string("LeakSanitizer found leaks (its report is above); the case ") +
          (tag == 'S'   ? "succeeded"
           : tag == 'E' ? "ended in: " + msg
                        : "threw: " + msg);
    tag = 'L';
  }
#endif
  child_send(fd, tag, code, msg);
  ::_exit(0);
}

}  // namespace detail

/// Runs `fn` in a forked child under `b` and reports how it ended (see the file comment).
template <class F>
report run_bounded(F&& fn, const bounds& b = {}) {
  report rep;
  rep.limits = b;
  int fds[2];
  if (::pipe(fds) != 0) {
    rep.what = outcome::exited;
    rep.detail = std::string("pipe failed: ") + std::strerror(errno);
    return rep;
  }
  std::fflush(nullptr);
  auto start = std::chrono::steady_clock::now();
  pid_t pid = ::fork();
  if (pid < 0) {
    rep.what = outcome::exited;
    rep.detail = std::string("fork failed: ") + std::strerror(errno);
    ::close(fds[0]);
    ::close(fds[1]);
    return rep;
  }
  if (pid == 0) {
    ::close(fds[0]);
    detail::child_main(fds[1], fn, b);
  }
  ::close(fds[1]);
  // Read to the end first (the child may fill the pipe), then reap.
  std::string got;
  char buf[4096];
  while (true) {
    ssize_t r = ::read(fds[0], buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got.append(buf, static_cast<std::size_t>(r));
  }
  ::close(fds[0]);
  int status = 0;
  struct rusage ru {};
  while (::wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  rep.peak_rss_bytes = static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;  // Linux: KiB
  if (WIFSIGNALED(status)) {
    rep.signal = WTERMSIG(status);
    rep.what = rep.signal == SIGALRM ? outcome::timed_out : outcome::crashed;
    rep.detail = std::string("signal ") + std::to_string(rep.signal) + " (" +
                 (::strsignal(rep.signal) ? ::strsignal(rep.signal) : "?") + ")";
    if (rep.signal == SIGKILL) rep.detail += "; the kernel's OOM killer sends this";
    return rep;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || got.empty()) {
    rep.what = outcome::exited;
    rep.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    rep.detail = got.empty() ? "no report from the child" : got.substr(1);
    return rep;
  }
  char tag = got[0];
  std::size_t nl = got.find('\n');
  int code = std::atoi(got.substr(1, nl == std::string::npos ? 0 : nl - 1).c_str());
  rep.detail = nl == std::string::npos ? std::string() : got.substr(nl + 1);
  switch (tag) {
    case 'E':
      rep.what = outcome::clear_error;
      rep.code = static_cast<cairn::errc>(code);
      break;
    case 'S':
      rep.what = outcome::succeeded;
      break;
    case 'M':
      rep.what = outcome::out_of_memory;
      break;
    case 'L':
      rep.what = outcome::leaked;
      break;
    default:
      rep.what = outcome::other_exception;
  }
  if (rep.peak_rss_bytes > b.memory_bytes && rep.what != outcome::leaked) {
    rep.detail =
        "peak RSS over the limit; the case ended with: " + std::string(outcome_name(rep.what)) +
        (rep.detail.empty() ? "" : ": " + rep.detail);
    rep.what = outcome::out_of_memory;
  }
  return rep;
}

}  // namespace cairn_hostile
