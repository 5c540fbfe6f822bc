// crash_trial: SIGKILLs checkpoint saves at random moments and checks the promise "a committed
// checkpoint survives anything that happens to a later save; a load returns exactly what was
// saved, or an error".
//
// Each trial starts a worker that saves a small training state (crash_state.hpp) once per step
// into one directory with `overwrite`, on thread ranks (one process) or as MPI processes under
// mpirun; waits until it is in save k at a random moment (or a chosen phase); SIGKILLs the
// process, one MPI process, or every process of the job; waits until all of them are gone; and
// checks:
//   1. the directory has no checkpoint only if no save had committed; otherwise
//      verify_checkpoint finds no problem, and a load on a random number of thread ranks
//      returns exactly the state of the last committed step or of the step in flight;
//   2. one more save (overwrite, another number of ranks) succeeds and loads exactly;
//   3. after it the directory holds metadata.json and the files it names, nothing else (no
//      temporary file of a killed put, no unreferenced data file).
// Any violation fails the run (exit 1) with the seed, trial number, what was expected and found.
//
// With --manager every save goes through a cairn::checkpointer (a root of checkpoints named by
// step, `latest`, retention keeping the last 1-3) and the checks become: load_latest loads
// exactly the last committed step or the one in flight (retention never deleted it); the next
// save through a checkpointer on another number of ranks succeeds, `latest` names it and it
// loads exactly; the root then holds `latest` and at most keep-last complete checkpoints, each
// holding nothing but its metadata.json and the files it names.
//
//   crash_trial [--threads N] [--mpi-one N] [--mpi-all N]   trials of each kind (shuffled)
//               [--manager]       saves through the checkpoint manager
//               [--seed S]        trial configurations are a function of (seed, trial number)
//               [--only T]        run trial T of this schedule only (timing still varies)
//               [--mpirun PATH] [--root DIR] [--keep N]   keep the first N failed trial dirs
//               [--fail-fast] [--verbose]
//               [--sabotage garbage|corrupt]   self-test: plant garbage or flip a byte, so
//                                              that every trial must fail
//   crash_trial --has-mpi         exit status 0 when built with MPI trials
//   crash_trial worker ...        (internal: the saving side)
//
// Under mpirun every rank is its own process group, so "all processes" means each rank and
// mpirun, found through the session the worker job runs in (it is started with setsid).
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cairn/manager/checkpointer.hpp"
#include "crash_state.hpp"
#include "probe.hpp"

#ifdef CAIRN_CRASH_MPI
#  include "cairn/comm/mpi.hpp"
#endif

namespace fs = std::filesystem;

namespace {

// --- the worker: saves step after step until it is killed -----------------------------------

struct worker_config {
  std::string dir, log, probe;
  bool mpi = false;
  int world = 1, size_class = 0, zstd = 0, io_threads = 2;
  bool plan_cache = false;
  bool index_files = false;  ///< format version 4
  int manager = 0;           ///< > 0: save through a checkpointer keeping this many
  std::int64_t max_steps = 100000;
};

/// The checkpointer every manager trial saves and loads through (root: the trial's directory).
cairn::checkpointer_options manager_options(int keep_last, const cairn::save_options& so) {
  cairn::checkpointer_options m;
  m.name = "step{step:08}";
  m.keep_last = keep_last;
  m.overwrite = true;
  m.save = so;
  return m;
}

/// Appends "<kind> <step> <ns>\n" to the log (one write: whole or not at all when killed).
void log_record(int fd, char kind, std::int64_t step) {
  char line[64];
  int n = std::snprintf(line, sizeof line, "%c %lld %lld\n", kind, static_cast<long long>(step),
                        static_cast<long long>(crash::now_ns()));
  if (::write(fd, line, static_cast<std::size_t>(n)) != n || ::fdatasync(fd) != 0) {
    std::perror("crash_trial worker: log");
    std::_Exit(4);
  }
}

/// One rank's save loop. Rank 0 logs "S step" before each save and "C step" after it returned
/// success, so the checker knows which steps may be on disk.
int worker_rank(cairn::comm_ref comm, const worker_config& c, crash::page* pg, int log_fd) {
  const int rank = comm.rank(), world = comm.size();
  crash::slot& me = pg->slots[rank];
  me.pid.store(static_cast<std::int32_t>(::getpid()));
  crash::rank_tree t;
  crash::build(t, world, rank, c.size_class, world);
  cairn::file_storage disk(c.dir);
  crash::probe_storage<cairn::file_storage> st(disk, me);
  cairn::save_plan_cache cache;
  cairn::save_options so;
  so.overwrite = true;
  so.zstd_level = c.zstd;
  so.io_threads = c.io_threads;
  so.plan_cache = c.plan_cache ? &cache : nullptr;
  so.index_files = c.index_files;
  std::optional<cairn::checkpointer> manager;
  if (c.manager > 0) manager.emplace(st, comm, manager_options(c.manager, so));
  const pid_t parent = ::getppid();  // the checker, or mpirun
  for (std::int64_t step = 1; step <= c.max_steps; ++step) {
    // An MPI rank whose mpirun is gone is an orphan: stop (thread workers die with the
    // checker through PR_SET_PDEATHSIG; one thread leaving alone would hang the others).
    if (c.mpi && ::getppid() != parent) std::_Exit(5);
    me.phase.store(crash::idle);
    crash::fill(t, step);
    if (rank == 0) log_record(log_fd, 'S', step);
    std::int64_t t0 = crash::now_ns();
    me.started_ns.store(t0);
    me.step.store(step);
    me.phase.store(crash::plan);
    cairn::result<void> r = cairn::ok();
    if (manager) {
      if (auto m = manager->try_save(t.sd, {.step = step}); !m) r = m.err();
    } else if (auto p = cairn::try_save(t.sd, st, comm, so); !p) {
      r = p.err();
    }
    me.phase.store(crash::returned);
    if (!r) {
      if (rank == 0) log_record(log_fd, 'F', step);
      std::fprintf(stderr, "worker rank %d/%d: save of step %lld failed: %s\n", rank, world,
                   static_cast<long long>(step), r.err().describe().c_str());
      return 3;
    }
    if (rank == 0) log_record(log_fd, 'C', step);
    me.save_ns.store(crash::now_ns() - t0);
    me.saves.fetch_add(1);
  }
  me.phase.store(crash::idle);
  return 0;
}

int worker_main(int argc, char** argv) {
  worker_config c;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value of " + a);
      return argv[++i];
    };
    if (a == "--dir")
      c.dir = next();
    else if (a == "--log")
      c.log = next();
    else if (a == "--probe")
      c.probe = next();
    else if (a == "--mpi")
      c.mpi = true;
    else if (a == "--world")
      c.world = std::stoi(next());
    else if (a == "--size")
      c.size_class = std::stoi(next());
    else if (a == "--zstd")
      c.zstd = std::stoi(next());
    else if (a == "--io-threads")
      c.io_threads = std::stoi(next());
    else if (a == "--plan-cache")
      c.plan_cache = std::stoi(next()) != 0;
    else if (a == "--index")
      c.index_files = std::stoi(next()) != 0;
    else if (a == "--max-steps")
      c.max_steps = std::stoll(next());
    else if (a == "--manager")
      c.manager = std::stoi(next());
    else
      throw std::runtime_error("unknown worker option " + a);
  }
  crash::page* pg = crash::map_page(c.probe, false);
  auto open_log = [&] {
    int fd = ::open(c.log.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("cannot open log " + c.log);
    return fd;
  };
  if (c.mpi) {
#ifdef CAIRN_CRASH_MPI
    cairn::mpi_environment env(argc, argv);
    int rc = 0;
    {
      cairn::mpi_communicator comm(MPI_COMM_WORLD);
      if (comm.size() > crash::max_ranks) throw std::runtime_error("too many ranks");
      int fd = comm.rank() == 0 ? open_log() : -1;
      rc = worker_rank(comm, c, pg, fd);
    }
    return rc;
#else
    throw std::runtime_error("built without MPI");
#endif
  }
  if (c.world < 1 || c.world > crash::max_ranks) throw std::runtime_error("bad --world");
  int fd = open_log();
  auto rcs = cairn::run_ranks_collect(
      c.world, [&](cairn::thread_communicator& comm) { return worker_rank(comm, c, pg, fd); });
  for (int rc : rcs)
    if (rc != 0) return rc;
  return 0;
}

// --- processes ----------------------------------------------------------------------------------

/// Starts `args` in a new session (its id is the returned pid) with stdout and stderr to
/// `out_path`.
pid_t spawn(const std::vector<std::string>& args, const std::string& out_path) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (out < 0 || in < 0) throw std::runtime_error("cannot open " + out_path);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {  // only async-signal-safe calls until exec
    // Dies with the checker (a ctest timeout, ^C): a worker must not save on unattended.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (::getppid() != parent) ::_exit(126);
    ::setsid();
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out);
  ::close(in);
  return pid;
}

/// Live (not zombie) processes of session `sid`.
std::vector<pid_t> session_members(pid_t sid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(text.substr(close + 1));
    char state = 0;
    long ppid = 0, pgrp = 0, session = 0;
    if (!(rest >> state >> ppid >> pgrp >> session)) continue;
    if (session == sid && state != 'Z' && state != 'X') out.push_back(std::stoi(name));
  }
  return out;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("signal ") + ::strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

/// Reaps every exited child (this process is a child subreaper: orphans of mpirun come here).
/// Records `main`'s status when it is among them.
void reap(pid_t main, bool& main_done, int& main_status) {
  int st = 0;
  pid_t p;
  while ((p = ::waitpid(-1, &st, WNOHANG)) > 0)
    if (p == main) main_done = true, main_status = st;
}

/// Waits until `main` has exited and session `sid` is empty, for at most `timeout_s`.
bool wait_gone(pid_t sid, pid_t main, bool& main_done, int& main_status, double timeout_s) {
  std::int64_t end = crash::now_ns() + static_cast<std::int64_t>(timeout_s * 1e9);
  for (;;) {
    reap(main, main_done, main_status);
    if (main_done && session_members(sid).empty()) return true;
    if (crash::now_ns() > end) return false;
    ::usleep(2000);
  }
}

void kill_all(pid_t sid) {
  for (int round = 0; round < 3; ++round)
    for (pid_t p : session_members(sid)) ::kill(p, SIGKILL);
}

// --- trials --------------------------------------------------------------------------------------

enum class mode { threads, mpi_one, mpi_all };

const char* mode_name(mode m) {
  return m == mode::threads ? "threads" : m == mode::mpi_one ? "mpi-one" : "mpi-all";
}

struct trial_config {
  mode m = mode::threads;
  int world = 2, size_class = 0, zstd = 0, io_threads = 2;
  bool plan_cache = false;
  bool index_files = false;  ///< format version 4 (the save after the kill: the other one)
  int kill_save = 1;         ///< kill during save k (1: before any commit)
  double kill_frac = 0;      ///< ... at this fraction of the expected save time
  int kill_phase = -1;       ///< or as soon as rank 0 enters this phase (>= 0)
  int victim = 0;            ///< mpi-one: the rank killed
  int load_ranks = 1, post_ranks = 1, post_load_ranks = 1, post_zstd = 0;
  int manager_keep = 0;  ///< > 0: through a checkpointer keeping this many

  std::string str() const {
    std::string s = std::string(mode_name(m)) + " world " + std::to_string(world) + ", size " +
                    std::to_string(size_class) + ", zstd " + std::to_string(zstd) +
                    ", plan cache " + (plan_cache ? "on" : "off") + ", format " +
                    (index_files ? "v4" : "v1-3") + ", io threads " + std::to_string(io_threads) +
                    "; kill in save " + std::to_string(kill_save);
    if (kill_phase >= 0)
      s += std::string(" at phase '") + crash::phase_name(static_cast<std::uint32_t>(kill_phase)) +
           "'";
    else
      s += " at " + std::to_string(static_cast<int>(kill_frac * 100)) + "% of a save";
    if (m == mode::mpi_one) s += ", victim rank " + std::to_string(victim);
    if (manager_keep > 0) s += ", checkpointer keeping " + std::to_string(manager_keep);
    s += "; check: load on " + std::to_string(load_ranks) + ", save on " +
         std::to_string(post_ranks) + " (zstd " + std::to_string(post_zstd) + "), load on " +
         std::to_string(post_load_ranks);
    return s;
  }
};

/// Trial `trial`'s configuration: a function of the seed and the trial number only.
trial_config make_config(std::uint64_t seed, int trial, mode m, bool manager) {
  std::mt19937_64 rng(crash::mix(seed) ^ crash::mix(static_cast<std::uint64_t>(trial) + 977));
  auto pick = [&](int lo, int hi) { return lo + static_cast<int>(rng() % (hi - lo + 1)); };
  trial_config c;
  c.m = m;
  int w = pick(0, 9);  // 1: 10%, 2..4: 30% each
  c.world = w == 0 ? 1 : 2 + (w - 1) % 3;
  int s = pick(0, 9);
  c.size_class = s < 4 ? 0 : s < 8 ? 1 : 2;
  c.zstd = pick(0, 9) < 6 ? 0 : pick(0, 1) ? 1 : 3;
  c.plan_cache = pick(0, 1) == 1;
  c.io_threads = pick(1, 3);
  c.kill_save = pick(0, 4) == 0 ? 1 : pick(2, 4);
  // A quarter of the trials aim at a phase (the short ones are rarely hit by chance).
  if (pick(0, 3) == 0) {
    static const int aimed[] = {crash::plan,       crash::write_data, crash::sync_data,
                                crash::put_common, crash::exchange,   crash::put_metadata,
                                crash::committed,  crash::removing,   crash::removing_temporaries,
                                crash::returned};
    c.kill_phase = aimed[pick(0, 9)];
  } else {
    c.kill_frac = static_cast<double>(pick(0, 1300)) / 1000.0;
  }
  c.victim = pick(0, c.world - 1);
  c.load_ranks = pick(1, 4);
  c.post_ranks = pick(1, 4);
  c.post_load_ranks = pick(1, 4);
  c.post_zstd = pick(0, 2) == 0 ? 1 : 0;
  c.index_files = pick(0, 1) == 1;
  if (manager) c.manager_keep = pick(1, 3);
  return c;
}

/// What the worker's log says.
struct log_summary {
  std::int64_t started = 0, committed = 0, failed = 0;
  std::vector<std::string> problems;
};

log_summary read_log(const std::string& path) {
  log_summary s;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    char kind = 0;
    long long step = 0, ns = 0;
    if (std::sscanf(line.c_str(), "%c %lld %lld", &kind, &step, &ns) != 3) {
      s.problems.push_back("malformed log line '" + line + "'");
      continue;
    }
    if (kind == 'S') {
      if (step != s.started + 1 || s.committed != s.started)
        s.problems.push_back("log: S " + std::to_string(step) + " out of order");
      s.started = step;
    } else if (kind == 'C') {
      if (step != s.started)
        s.problems.push_back("log: C " + std::to_string(step) + " out of order");
      s.committed = step;
    } else if (kind == 'F') {
      s.failed = step;
    }
  }
  return s;
}

/// Checks what rank `rank`'s tree `t` holds after a load: a step among `allowed`, and every
/// byte that step's. Appends violations to `out`; returns the step (nullopt: none loaded).
std::optional<std::int64_t> check_loaded(const crash::rank_tree& t,
                                         int rank,
                                         const std::vector<std::int64_t>& allowed,
                                         std::vector<std::string>& out) {
  auto got = crash::loaded_step(t);
  if (!got) {
    out.push_back("rank " + std::to_string(rank) + ": no step value loaded");
    return got;
  }
  if (std::find(allowed.begin(), allowed.end(), *got) == allowed.end()) {
    std::string a;
    for (auto x : allowed) a += (a.empty() ? "" : " or ") + std::to_string(x);
    out.push_back("rank " + std::to_string(rank) + " loaded step " + std::to_string(*got) +
                  ", expected step " + a);
  }
  std::vector<std::int64_t> candidates;  // the steps a wrong byte could come from
  for (std::int64_t c = 0; c <= *std::max_element(allowed.begin(), allowed.end()) + 1; ++c)
    candidates.push_back(c);
  for (auto& d : crash::differences(t, *got, candidates)) out.push_back(std::move(d));
  return got;
}

/// Loads the checkpoint in `dir` on `ranks` thread ranks (saved on `object_world` ranks) and
/// compares every byte with the step it says it holds, which must be one of `allowed`.
/// Returns the violations; `loaded` is the step read (-1 when the load failed).
std::vector<std::string> load_and_compare(const fs::path& dir,
                                          int ranks,
                                          int size_class,
                                          int object_world,
                                          const std::vector<std::int64_t>& allowed,
                                          std::int64_t& loaded) {
  std::mutex mu;
  std::vector<std::string> out;
  loaded = -1;
  try {
    cairn::run_ranks(ranks, [&](cairn::thread_communicator& comm) {
      crash::rank_tree t;
      crash::build(t, comm.size(), comm.rank(), size_class, object_world);
      cairn::file_storage disk(dir);
      cairn::load_options lo;
      lo.strict = cairn::strict_mode::raise_all;  // exactly our keys, no more, no fewer
      auto r = cairn::try_load(t.sd, disk, comm, lo);
      std::vector<std::string> mine;
      std::int64_t s = -1;
      if (!r) {
        mine.push_back("load on " + std::to_string(ranks) + " ranks failed on rank " +
                       std::to_string(comm.rank()) + ": " + r.err().describe());
      } else {
        s = check_loaded(t, comm.rank(), allowed, mine).value_or(-1);
      }
      std::lock_guard lk(mu);
      if (comm.rank() == 0) loaded = s;
      out.insert(out.end(), mine.begin(), mine.end());
    });
  } catch (const std::exception& e) {
    out.push_back(std::string("load threw: ") + e.what());
  }
  return out;
}

/// Saves step `step` on `ranks` thread ranks into `dir` (overwrite).
/// Saves step `step` on `ranks` thread ranks into `dir` (overwrite); with `manager_keep` > 0,
/// through a checkpointer rooted at `dir` that keeps that many (its retention must not fail).
std::vector<std::string> save_step(const fs::path& dir,
                                   int ranks,
                                   int size_class,
                                   int zstd,
                                   bool index_files,
                                   std::int64_t step,
                                   int manager_keep = 0) {
  std::mutex mu;
  std::vector<std::string> out;
  try {
    cairn::run_ranks(ranks, [&](cairn::thread_communicator& comm) {
      crash::rank_tree t;
      crash::build(t, comm.size(), comm.rank(), size_class, comm.size());
      crash::fill(t, step);
      cairn::file_storage disk(dir);
      cairn::save_options so;
      so.overwrite = true;
      so.zstd_level = zstd;
      so.index_files = index_files;
      cairn::result<void> r = cairn::ok();
      if (manager_keep > 0) {
        cairn::checkpointer manager(disk, comm, manager_options(manager_keep, so));
        auto m = manager.try_save(t.sd, {.step = step});
        if (!m)
          r = m.err();
        else if (m->committed && !m->committed->retention_errors.empty())
          r = m->committed->retention_errors.front();
      } else if (auto p = cairn::try_save(t.sd, disk, comm, so); !p) {
        r = p.err();
      }
      if (!r && comm.rank() == 0) {
        std::lock_guard lk(mu);
        out.push_back("the next save (step " + std::to_string(step) + " on " +
                      std::to_string(ranks) + " ranks, overwrite) failed: " + r.err().describe());
      }
    });
  } catch (const std::exception& e) {
    out.push_back(std::string("the next save threw: ") + e.what());
  }
  return out;
}

std::vector<std::string> verify(const fs::path& dir, const char* which) {
  std::vector<std::string> out;
  cairn::file_storage disk(dir);
  auto v = cairn::verify_checkpoint(disk);
  if (!v) {
    out.push_back(std::string("verify_checkpoint of ") + which + " failed: " + v.err().describe());
    return out;
  }
  for (const auto& p : *v)
    out.push_back(std::string("verify_checkpoint of ") + which + ": " + p.item + ": " +
                  p.err.describe());
  return out;
}

/// A file or directory in a checkpoint directory that its metadata.json does not name.
struct leftover {
  std::string path;  ///< relative to the directory
  std::uintmax_t bytes = 0;
  const char* kind;  ///< "temporary", "unreferenced", "unknown", "directory"
  std::string str() const {
    static const std::map<std::string, const char*> what = {
        {"temporary", "temporary file of a killed put"},
        {"unreferenced", "data, common or index file that metadata.json does not name"},
        {"unknown", "unknown file"},
        {"directory", "directory"}};
    return path + " (" + std::to_string(bytes) + " bytes: " + what.at(kind) + ")";
  }
};

/// Everything in `dir` but metadata.json and the files it names (everything when there is no
/// metadata.json), as std::filesystem sees it: hidden temporaries included.
std::vector<leftover> leftovers(const fs::path& dir, std::string& error) {
  std::vector<leftover> out;
  cairn::file_storage disk(dir);
  std::set<std::string> wanted;
  auto has = disk.exists(cairn::metadata_name);
  if (has && *has) {
    auto m = cairn::read_metadata(disk);
    if (!m) {
      error = "cannot read metadata.json: " + m.err().describe();
      return out;
    }
    wanted.insert(std::string(cairn::metadata_name));
    for (const auto& f : m->files) wanted.insert(f.name);
  }
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    std::string rel = fs::relative(it->path(), dir).string();
    std::string name = it->path().filename().string();
    std::error_code ec2;
    if (it->is_directory(ec2)) {
      bool holds_wanted = std::any_of(wanted.begin(), wanted.end(), [&](const std::string& w) {
        return w.rfind(rel + "/", 0) == 0;
      });
      if (!holds_wanted) out.push_back({rel, 0, "directory"});
      continue;
    }
    if (wanted.count(rel)) continue;
    auto size = fs::file_size(it->path(), ec2);
    const char* kind = cairn::file_storage::is_temp_name(name) ? "temporary"
                       : (name.rfind("data.", 0) == 0 || name.rfind("common.", 0) == 0 ||
                          name.rfind("index.", 0) == 0)
                           ? "unreferenced"
                           : "unknown";
    out.push_back({rel, ec2 ? 0 : size, kind});
  }
  if (ec && ec != std::errc::no_such_file_or_directory)
    error = "listing " + dir.string() + ": " + ec.message();
  return out;
}

struct run_stats;

/// Manager trials, after the kill: what load_latest finds under `root`, the next save through a
/// checkpointer, and what the root holds after it (see the header).
void check_manager_root(const trial_config& c,
                        const fs::path& root,
                        const log_summary& lg,
                        run_stats& stats,
                        std::string& summary,
                        std::vector<std::string>& bad);

struct run_stats {
  int trials = 0, failed = 0;
  std::map<std::string, int> modes, outcomes, violations;
  /// "<mode>: <phase>" -> outcome -> trials
  std::map<std::string, std::map<std::string, int>> kill_phases;
  std::int64_t commits = 0;
  int aimed = 0, aimed_hit = 0;
  int garbage_trials = 0;                    ///< trials whose kill left garbage
  std::map<std::string, int> garbage_files;  ///< by kind, over all trials
};

/// load_latest under `root` on `ranks` thread ranks (saved on `object_world` ranks): appends
/// violations to `bad` when it fails or loads anything but one of `allowed` exactly. Returns
/// the checkpoint's name and step (empty and -1: none found).
std::pair<std::string, std::int64_t> load_latest_and_compare(
    const fs::path& root,
    int ranks,
    int size_class,
    int object_world,
    int keep,
    const std::vector<std::int64_t>& allowed,
    std::vector<std::string>& bad) {
  std::mutex mu;
  std::pair<std::string, std::int64_t> found{"", -1};
  try {
    cairn::run_ranks(ranks, [&](cairn::thread_communicator& comm) {
      crash::rank_tree t;
      crash::build(t, comm.size(), comm.rank(), size_class, object_world);
      cairn::file_storage disk(root);
      cairn::checkpointer manager(disk, comm, manager_options(keep, {}));
      cairn::load_options lo;
      lo.strict = cairn::strict_mode::raise_all;
      auto r = manager.load_latest(t.sd, lo);
      std::vector<std::string> mine;
      if (!r) {
        mine.push_back("load_latest on " + std::to_string(ranks) + " ranks failed on rank " +
                       std::to_string(comm.rank()) + ": " + r.err().describe());
      } else if (*r) {
        auto got = check_loaded(t, comm.rank(), allowed, mine);
        if (got && *got != (*r)->counters.step)
          mine.push_back("rank " + std::to_string(comm.rank()) + ": load_latest says step " +
                         std::to_string((*r)->counters.step) + ", the tree holds " +
                         std::to_string(*got));
        if (comm.rank() == 0) found = {(*r)->name, got.value_or(-1)};
      }
      std::lock_guard lk(mu);
      bad.insert(bad.end(), mine.begin(), mine.end());
    });
  } catch (const std::exception& e) {
    bad.push_back(std::string("load_latest threw: ") + e.what());
  }
  return found;
}

struct options {
  int threads = 0, mpi_one = 0, mpi_all = 0;
  std::uint64_t seed = 0;
  bool seed_given = false;
  int only = -1;
  std::string mpirun = "mpirun";
  std::string root;
  int keep = 5;
  bool fail_fast = false, verbose = false;
  std::string sabotage;  ///< self-test of the checker: "garbage" or "corrupt"
  bool has_mpi = false;  ///< only answer (exit status) whether this build runs MPI trials
  bool manager = false;  ///< save through the checkpoint manager
};

struct trial_env {
  std::string self;  // this executable
  const options* opt;
  std::map<std::string, double> est_ms;  // expected save time per mode and size class
};

/// Runs one trial; returns its violations (empty: passed).
std::vector<std::string> run_trial(trial_env& env,
                                   const trial_config& c,
                                   const fs::path& tdir,
                                   run_stats& stats,
                                   std::string& summary) {
  std::vector<std::string> bad;
  fs::create_directories(tdir);
  const fs::path ckpt = tdir / "ckpt";
  const std::string log = (tdir / "log").string(), probe_path = (tdir / "probe").string();
  crash::page* pg = crash::map_page(probe_path, true);
  std::shared_ptr<void> unmap(nullptr, [pg](void*) { ::munmap(pg, sizeof(crash::page)); });
  const bool mpi = c.m != mode::threads;
  std::vector<std::string> args;
  if (mpi) {
    // Open MPI's session directory and shared-memory segments go into the trial directory: a
    // killed job leaves them behind, and they go with it.
    args = {env.opt->mpirun, "--oversubscribe", "-np", std::to_string(c.world)};
    for (const char* param : {"orte_tmpdir_base", "btl_vader_backing_directory"})
      args.insert(args.end(), {"--mca", param, tdir.string()});
    args.insert(args.end(), {env.self, "worker", "--mpi"});
  } else {
    args = {env.self, "worker", "--world", std::to_string(c.world)};
  }
  args.insert(args.end(), {"--dir",        ckpt.string(),
                           "--log",        log,
                           "--probe",      probe_path,
                           "--size",       std::to_string(c.size_class),
                           "--zstd",       std::to_string(c.zstd),
                           "--io-threads", std::to_string(c.io_threads),
                           "--plan-cache", c.plan_cache ? "1" : "0",
                           "--index",      c.index_files ? "1" : "0",
                           "--max-steps",  std::to_string(c.kill_save + 50),
                           "--manager",    std::to_string(c.manager_keep)});
  const std::string est_key = std::string(mpi ? "mpi" : "threads") + std::to_string(c.size_class);
  double est_ms = env.est_ms.count(est_key) ? env.est_ms[est_key] : (mpi ? 40.0 : 20.0);

  pid_t pid = spawn(args, (tdir / "worker.out").string());
  bool done = false;
  int status = 0;
  // Whatever happens below (a harness error throws), the job does not outlive the trial.
  bool job_over = false;
  std::shared_ptr<void> end_job(nullptr, [&](void*) {
    if (job_over) return;
    kill_all(pid);
    if (!done) ::kill(pid, SIGKILL);
    wait_gone(pid, pid, done, status, 10.0);
  });
  crash::slot& r0 = pg->slots[0];
  // Wait until rank 0 is in save k (and, under mpirun, every rank has started).
  std::int64_t deadline = crash::now_ns() + 120'000'000'000;
  auto ready = [&] {
    if (r0.step.load() < c.kill_save) return false;
    for (int r = 0; r < c.world; ++r)
      if (pg->slots[r].pid.load() == 0) return false;
    return true;
  };
  while (!ready()) {
    reap(pid, done, status);
    if (done) break;
    if (crash::now_ns() > deadline) {
      bad.push_back("worker did not reach save " + std::to_string(c.kill_save) + " in 120 s");
      break;
    }
    ::usleep(100);
  }
  if (done) {
    bad.push_back("worker ended before it was killed (" + describe_status(status) + ")");
  }
  std::uint32_t phase_before = 0;
  bool aimed_hit = false;
  if (bad.empty()) {
    if (c.kill_phase >= 0) {
      // Spin until rank 0 is in the aimed phase of save k, or save k is over.
      for (;;) {
        std::uint32_t p = r0.phase.load();
        std::int64_t s = r0.step.load();
        if (s == c.kill_save && p == static_cast<std::uint32_t>(c.kill_phase)) {
          aimed_hit = true;
          break;
        }
        if (s > c.kill_save || (s == c.kill_save && p == crash::idle)) break;
        if (crash::now_ns() > deadline) break;
        std::this_thread::yield();
      }
    } else {
      std::int64_t at =
          r0.started_ns.load() + static_cast<std::int64_t>(c.kill_frac * est_ms * 1e6);
      timespec ts{static_cast<time_t>(at / 1'000'000'000), static_cast<long>(at % 1'000'000'000)};
      while (::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
      }
    }
    phase_before = r0.phase.load();
    // A rank's pid as it registered (kill(0) or kill(-1) would hit far more than the job).
    auto rank_pid = [&](int r) {
      pid_t p = static_cast<pid_t>(pg->slots[r].pid.load());
      if (p <= 1) throw std::runtime_error("rank " + std::to_string(r) + " has no pid");
      return p;
    };
    if (c.m == mode::threads) {
      ::kill(pid, SIGKILL);
    } else if (c.m == mode::mpi_one) {
      ::kill(rank_pid(c.victim), SIGKILL);
    } else {
      for (int r = 0; r < c.world; ++r) ::kill(rank_pid(r), SIGKILL);
      kill_all(pid);
    }
  }
  // Everything must be gone before the directory is looked at: mpirun ends the job when one
  // process dies; a process still alive after that is an orphan.
  if (!wait_gone(pid, pid, done, status, c.m == mode::mpi_one ? 60.0 : 10.0)) {
    auto left = session_members(pid);
    std::string l;
    for (pid_t p : left) l += " " + std::to_string(p);
    bad.push_back(std::string(done ? "processes outlived mpirun:" : "the job did not end:") + l +
                  " (killed now)");
    kill_all(pid);
    if (!done) ::kill(pid, SIGKILL);
    if (!wait_gone(pid, pid, done, status, 10.0)) bad.push_back("processes survive SIGKILL");
  }
  job_over = true;

  // Where the kill landed: rank 0's last phase (the killed rank's when one MPI process).
  int who = c.m == mode::mpi_one ? c.victim : 0;
  std::uint32_t at_death = pg->slots[who].phase.load();
  std::int64_t death_step = pg->slots[who].step.load();
  std::string kill_at = death_step == 0 ? "before the first save" : crash::phase_name(at_death);
  if (c.kill_phase >= 0) {
    ++stats.aimed;
    stats.aimed_hit += aimed_hit;
  }
  std::int64_t save_ns = r0.save_ns.load();
  if (save_ns > 0) {
    double ms = static_cast<double>(save_ns) / 1e6;
    env.est_ms[est_key] = env.est_ms.count(est_key) ? 0.8 * env.est_ms[est_key] + 0.2 * ms : ms;
  }

  log_summary lg = read_log(log);
  for (auto& p : lg.problems) bad.push_back(p);
  stats.commits += lg.committed;
  summary = (at_death == crash::idle ? "killed after save " + std::to_string(death_step) + ", '"
                                     : "killed in save " + std::to_string(death_step) + " at '") +
            kill_at + "'" +
            (c.m == mode::mpi_one ? " (rank " + std::to_string(c.victim) + ")" : "") +
            (c.m == mode::mpi_one
                 ? std::string(", rank 0 at '") + crash::phase_name(phase_before) + "' when killed"
                 : std::string()) +
            "; log: started " + std::to_string(lg.started) + ", committed " +
            std::to_string(lg.committed) +
            (lg.failed ? ", a failed save " + std::to_string(lg.failed) : "") + "; worker " +
            (done ? describe_status(status) : "?");

  if (c.manager_keep > 0) {
    check_manager_root(c, ckpt, lg, stats, summary, bad);
    return bad;
  }

  if (env.opt->sabotage == "corrupt") {  // self-test: a flipped byte must be caught
    cairn::file_storage d(ckpt);
    if (auto m = cairn::read_metadata(d); m && !m->tensors.empty()) {
      const cairn::extent& e = m->tensors.begin()->second.chunks.at(0).where;
      std::fstream io(ckpt / m->files.at(e.file).name,
                      std::ios::in | std::ios::out | std::ios::binary);
      char b = 0;
      io.seekg(static_cast<std::streamoff>(e.byte_offset));
      io.get(b);
      io.seekp(static_cast<std::streamoff>(e.byte_offset));
      io.put(static_cast<char>(b ^ 0x40));
    }
  }

  // 1. What is on disk: nothing (only if nothing committed), or exactly step C or S.
  cairn::file_storage disk(ckpt);
  auto has = disk.exists(cairn::metadata_name);
  std::string outcome;
  if (!has) {
    bad.push_back("cannot stat metadata.json: " + has.err().describe());
  } else if (!*has) {
    outcome = "no checkpoint";
    if (lg.committed > 0)
      bad.push_back("no metadata.json although step " + std::to_string(lg.committed) +
                    " had committed");
  } else {
    for (auto& v : verify(ckpt, "the surviving checkpoint")) bad.push_back(v);
    std::vector<std::int64_t> allowed;
    if (lg.committed > 0) allowed.push_back(lg.committed);
    if (lg.started > lg.committed) allowed.push_back(lg.started);
    if (allowed.empty()) {
      bad.push_back("metadata.json exists although no save was started");
    } else {
      std::int64_t got = -1;
      for (auto& v : load_and_compare(ckpt, c.load_ranks, c.size_class, c.world, allowed, got))
        bad.push_back(v);
      outcome = got < 0               ? "load failed"
                : got == lg.committed ? "last committed step"
                : got == lg.started   ? "step in flight"
                                      : "other step";
      summary += "; on disk: step " + std::to_string(got);
    }
  }
  ++stats.outcomes[outcome.empty() ? "?" : outcome];
  ++stats
        .kill_phases[std::string(mode_name(c.m)) + ": " + kill_at][outcome.empty() ? "?" : outcome];

  // What the kill left for the next save to clean up.
  {
    std::string err;
    auto left = leftovers(ckpt, err);
    if (!err.empty()) bad.push_back(err);
    stats.garbage_trials += !left.empty();
    for (const auto& l : left) ++stats.garbage_files[l.kind];
    if (!left.empty()) summary += "; " + std::to_string(left.size()) + " file(s) of garbage";
  }
  // 2. The next save replaces it and loads exactly; 3. it leaves nothing else behind.
  std::int64_t next = std::max(lg.started, lg.committed) + 1;
  auto s = save_step(ckpt, c.post_ranks, c.size_class, c.post_zstd, !c.index_files, next);
  bad.insert(bad.end(), s.begin(), s.end());
  if (s.empty()) {
    std::int64_t got = -1;
    for (auto& v :
         load_and_compare(ckpt, c.post_load_ranks, c.size_class, c.post_ranks, {next}, got))
      bad.push_back("after the next save: " + v);
    for (auto& v : verify(ckpt, "the next save")) bad.push_back(v);
    if (env.opt->sabotage == "garbage") {  // self-test: planted garbage must be reported
      std::ofstream(ckpt / ".metadata.json.tmp.12345.0123456789abcdef") << "x";
      std::ofstream(ckpt / "junk.bin") << "x";
    }
    std::string err;
    auto left = leftovers(ckpt, err);
    if (!err.empty()) bad.push_back(err);
    if (!left.empty()) {
      std::string l;
      for (auto& x : left) l += "\n      " + x.str();
      bad.push_back("the next save left " + std::to_string(left.size()) +
                    " file(s) besides metadata.json and the files it names:" + l);
    }
  }
  return bad;
}

void check_manager_root(const trial_config& c,
                        const fs::path& root,
                        const log_summary& lg,
                        run_stats& stats,
                        std::string& summary,
                        std::vector<std::string>& bad) {
  const int keep = c.manager_keep;
  // 1. load_latest: the last committed step or the one in flight, exactly; none only if no save
  //    had committed.
  std::vector<std::int64_t> allowed;
  if (lg.committed > 0) allowed.push_back(lg.committed);
  if (lg.started > lg.committed) allowed.push_back(lg.started);
  std::string outcome = "no checkpoint";
  if (!allowed.empty()) {
    auto [name, got] =
        load_latest_and_compare(root, c.load_ranks, c.size_class, c.world, keep, allowed, bad);
    if (name.empty()) {
      if (lg.committed > 0)
        bad.push_back("load_latest found no checkpoint although step " +
                      std::to_string(lg.committed) + " had committed");
    } else {
      for (auto& v : verify(root / name, "the latest checkpoint")) bad.push_back(v);
      outcome = got == lg.committed ? "last committed step"
                : got == lg.started ? "step in flight"
                                    : "other step";
      summary += "; latest: " + name;
    }
  }
  ++stats.outcomes[outcome];
  // 2. The next save through a checkpointer on another number of ranks, then load_latest.
  const std::int64_t next = std::max(lg.started, lg.committed) + 1;
  for (auto& v :
       save_step(root, c.post_ranks, c.size_class, c.post_zstd, !c.index_files, next, keep))
    bad.push_back(std::move(v));
  if (!bad.empty()) return;
  auto [name, got] = load_latest_and_compare(root, c.post_load_ranks, c.size_class, c.post_ranks,
                                             keep, {next}, bad);
  if (got != next) bad.push_back("after the next save: load_latest did not load it");
  // 3. The root: `latest`, at most `keep` complete checkpoints, each with nothing else in it.
  cairn::file_storage disk(root);
  auto names = cairn::name_template::parse("step{step:08}").value();
  auto listed = cairn::list_checkpoints(disk, &names);
  if (!listed) {
    bad.push_back("list_checkpoints: " + listed.err().describe());
    return;
  }
  int complete = 0;
  for (const auto& e : *listed) {
    if (!e.complete) {
      bad.push_back("after the next save: incomplete checkpoint " + e.name + " left (" +
                    std::to_string(e.objects) + " objects)");
      continue;
    }
    ++complete;
    std::string err;
    for (const auto& l : leftovers(root / e.name, err))
      bad.push_back("after the next save: in " + e.name + ": " + l.str());
    if (!err.empty()) bad.push_back(err);
  }
  if (complete > keep)
    bad.push_back("after the next save: " + std::to_string(complete) +
                  " complete checkpoints, more than keep_last " + std::to_string(keep));
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::error_code ec2;
    if (e.is_directory(ec2)) continue;  // folders emptied by retention stay on file storage
    if (e.path().filename() != "latest")
      bad.push_back("after the next save: " + e.path().filename().string() + " at the root");
  }
}

const char* kind_of(const std::string& v) {
  if (v.rfind("the next save left", 0) == 0) return "garbage after the next save";
  if (v.find("verify_checkpoint") != std::string::npos) return "verify_checkpoint problem";
  if (v.find("load") != std::string::npos && v.find("failed") != std::string::npos)
    return "load failed";
  if (v.find("differs") != std::string::npos || v.find("loaded step") != std::string::npos)
    return "wrong data loaded";
  if (v.find("next save") != std::string::npos) return "next save failed";
  if (v.find("processes") != std::string::npos || v.find("job") != std::string::npos)
    return "processes";
  return "other";
}

int usage() {
  std::fprintf(stderr,
               "usage: crash_trial [--threads N] [--mpi-one N] [--mpi-all N] [--seed S] "
               "[--only T] [--mpirun PATH] [--root DIR] [--keep N] [--fail-fast] [--verbose] "
               "[--sabotage garbage|corrupt] [--manager]\n");
  return 2;
}

int checker_main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value of " + a);
      return argv[++i];
    };
    if (a == "--threads")
      o.threads = std::stoi(next());
    else if (a == "--mpi-one")
      o.mpi_one = std::stoi(next());
    else if (a == "--mpi-all")
      o.mpi_all = std::stoi(next());
    else if (a == "--seed")
      o.seed = std::stoull(next()), o.seed_given = true;
    else if (a == "--only")
      o.only = std::stoi(next());
    else if (a == "--mpirun")
      o.mpirun = next();
    else if (a == "--root")
      o.root = next();
    else if (a == "--keep")
      o.keep = std::stoi(next());
    else if (a == "--fail-fast")
      o.fail_fast = true;
    else if (a == "--verbose")
      o.verbose = true;
    else if (a == "--sabotage")
      o.sabotage = next();
    else if (a == "--has-mpi")
      o.has_mpi = true;
    else if (a == "--manager")
      o.manager = true;
    else
      return usage();
  }
#ifndef CAIRN_CRASH_MPI
  if (o.mpi_one + o.mpi_all > 0) {
    std::fprintf(stderr, "crash_trial: built without MPI; --mpi-one/--mpi-all unavailable\n");
    return 2;
  }
#endif
  if (o.has_mpi) {
#ifdef CAIRN_CRASH_MPI
    return 0;
#else
    return 1;
#endif
  }
  if (o.threads + o.mpi_one + o.mpi_all == 0) return usage();
  if (!o.seed_given) o.seed = std::random_device{}() ^ static_cast<std::uint64_t>(crash::now_ns());
  if (o.mpirun.find('/') == std::string::npos) {  // execv needs a path
    for (const char* d : {"/usr/bin/", "/usr/local/bin/", "/bin/"})
      if (::access((std::string(d) + o.mpirun).c_str(), X_OK) == 0) {
        o.mpirun = d + o.mpirun;
        break;
      }
  }
  if (::geteuid() == 0) {  // Open MPI refuses root unless told
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  ::setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  // Orphans of a killed mpirun become our children, so that they are seen and reaped.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);

  trial_env env;
  env.self = fs::read_symlink("/proc/self/exe").string();
  env.opt = &o;
  fs::path root = o.root;
  if (root.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "cairn-crash-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    root = tmpl;
  }
  std::vector<mode> schedule;
  schedule.insert(schedule.end(), o.threads, mode::threads);
  schedule.insert(schedule.end(), o.mpi_one, mode::mpi_one);
  schedule.insert(schedule.end(), o.mpi_all, mode::mpi_all);
  std::mt19937_64 order(o.seed);
  std::shuffle(schedule.begin(), schedule.end(), order);

  std::printf(
      "crash trials: %d on thread ranks, %d killing one MPI process, %d killing all; "
      "seed %llu; in %s\n",
      o.threads, o.mpi_one, o.mpi_all, static_cast<unsigned long long>(o.seed), root.c_str());
  std::fflush(stdout);
  run_stats stats;
  int kept = 0;
  std::int64_t start = crash::now_ns();
  std::string rerun = argv[0];
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--only" || a == "--seed") {
      ++i;
      continue;
    }
    rerun += " " + a;
  }
  for (int t = 0; t < static_cast<int>(schedule.size()); ++t) {
    if (o.only >= 0 && t != o.only) continue;
    trial_config c = make_config(o.seed, t, schedule[t], o.manager);
    if (!o.sabotage.empty()) {  // the self-tests need a committed checkpoint
      c.kill_save = std::max(c.kill_save, 2);
      c.kill_phase = -1;
      c.kill_frac = 0.5;
    }
    fs::path tdir = root / ("trial-" + std::to_string(t));
    std::string summary;
    std::vector<std::string> bad;
    try {
      bad = run_trial(env, c, tdir, stats, summary);
    } catch (const std::exception& e) {
      bad.push_back(std::string("harness error: ") + e.what());
    }
    ++stats.trials;
    ++stats.modes[mode_name(c.m)];
    if (bad.empty()) {
      if (o.verbose) std::printf("trial %d ok: %s; %s\n", t, c.str().c_str(), summary.c_str());
      std::error_code ec;
      fs::remove_all(tdir, ec);
    } else {
      ++stats.failed;
      std::set<std::string> kinds;
      for (const auto& v : bad) kinds.insert(kind_of(v));
      for (const auto& k : kinds) ++stats.violations[k];
      std::printf("FAIL trial %d (seed %llu): %s\n  %s\n", t,
                  static_cast<unsigned long long>(o.seed), c.str().c_str(), summary.c_str());
      for (const auto& v : bad) std::printf("  - %s\n", v.c_str());
      if (kept < o.keep) {
        ++kept;
        std::printf("  kept %s (worker output: worker.out, log: log)\n", tdir.c_str());
      } else {
        std::error_code ec;
        fs::remove_all(tdir, ec);
      }
      std::printf("  rerun this trial: %s --seed %llu --only %d\n", rerun.c_str(),
                  static_cast<unsigned long long>(o.seed), t);
      if (o.fail_fast) break;
    }
    if (!o.verbose && stats.trials % 100 == 0)
      std::printf("... %d trials, %d failed, %.0f s\n", stats.trials, stats.failed,
                  static_cast<double>(crash::now_ns() - start) / 1e9);
    std::fflush(stdout);
  }
  double secs = static_cast<double>(crash::now_ns() - start) / 1e9;
  std::printf("\ncrash trials: %d run (", stats.trials);
  bool first = true;
  for (const auto& [m, n] : stats.modes)
    std::printf("%s%s %d", first ? "" : ", ", m.c_str(), n), first = false;
  std::printf("), %d failed, seed %llu, %.1f s\n", stats.failed,
              static_cast<unsigned long long>(o.seed), secs);
  std::printf("  saves committed before the kills: %lld\n", static_cast<long long>(stats.commits));
  std::printf("  on disk after the kill:");
  for (const auto& [k, n] : stats.outcomes) std::printf(" %s %d;", k.c_str(), n);
  std::printf("\n  garbage the kill left (for the next save to clean up): in %d trials;",
              stats.garbage_trials);
  for (const auto& [k, n] : stats.garbage_files) std::printf(" %s files %d;", k.c_str(), n);
  std::printf(
      "\n  aimed at a phase: %d (hit %d)\n  where the kill landed (rank 0, or the killed "
      "rank for mpi-one):\n",
      stats.aimed, stats.aimed_hit);
  for (const auto& [k, by] : stats.kill_phases) {
    int n = 0;
    std::string detail;
    for (const auto& [o, m] : by) {
      n += m;
      detail += (detail.empty() ? "" : ", ") + o + " " + std::to_string(m);
    }
    std::printf("    %-36s %5d  (%s)\n", k.c_str(), n, detail.c_str());
  }
  if (!stats.violations.empty()) {
    std::printf("  failed trials by violation:\n");
    for (const auto& [k, n] : stats.violations) std::printf("    %-40s %d\n", k.c_str(), n);
  }
  if (kept == 0) {
    std::error_code ec;
    if (o.root.empty()) fs::remove_all(root, ec);
  }
  return stats.failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::string(argv[1]) == "worker") return worker_main(argc, argv);
    return checker_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "crash_trial: %s\n", e.what());
    return 2;
  }
}
