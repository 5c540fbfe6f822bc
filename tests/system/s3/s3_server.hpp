// Test fixtures for the s3 backend: an s3rver process on 127.0.0.1 (from .deps/, installed by
// scripts/bootstrap), node helper scripts (the 503 SlowDown proxy, the header-echoing server, the
// AWS SDK reference signer and reader), an HTTP GET through libcurl, and options pointing
// s3_storage at them.
#pragma once

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cairn/storage/s3.hpp"
#include "tests/support/source_dir.hpp"

extern char** environ;

namespace cairn_s3_test {

/// The repository root (for .deps/ and the node scripts).
inline std::string source_dir() { return cairn_test::source_dir(); }
/// Where the node scripts of these tests are.
inline std::string script(const std::string& name) {
  return source_dir() + "/tests/system/s3/" + name;
}
/// s3rver's launcher in .deps/.
inline std::string s3rver_bin() { return source_dir() + "/.deps/node_modules/.bin/s3rver"; }

/// A port that was free a moment ago.
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

/// Whether something accepts connections on 127.0.0.1:port.
inline bool port_open(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

/// A child process, killed (SIGKILL) and reaped when the object dies.
struct child {
  pid_t pid = -1;
  void start(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env) {
    std::vector<std::string> env_store;
    for (char** e = environ; *e; ++e) env_store.emplace_back(*e);
    for (const auto& e : extra_env) env_store.push_back(e);
    std::vector<char*> envp, args;
    for (auto& e : env_store) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_store = argv;
    for (auto& a : argv_store) args.push_back(a.data());
    args.push_back(nullptr);
    if (::posix_spawnp(&pid, args[0], nullptr, nullptr, args.data(), envp.data()) != 0)
      throw std::runtime_error("cannot start " + argv[0]);
  }
  bool running() const {
    if (pid <= 0) return false;
    int st = 0;
    return ::waitpid(pid, &st, WNOHANG) == 0;
  }
  void kill() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
    pid = -1;
  }
  ~child() { kill(); }
};

/// Why the s3 tests cannot run here (node or s3rver missing), or empty.
inline std::string skip_reason() {
  if (std::system("node --version > /dev/null 2>&1") != 0)
    return "node is not installed (scripts/bootstrap installs nodejs and npm)";
  if (!std::filesystem::exists(s3rver_bin()))
    return "s3rver is not installed in .deps/ (run scripts/bootstrap)";
  return {};
}

/// True, after printing "SKIP: <reason>" (which ctest reports as a skip), when the s3 tests
/// cannot run here: `if (skipped()) return;`.
inline bool skipped() {
  std::string why = skip_reason();
  if (why.empty()) return false;
  std::printf("SKIP: %s\n", why.c_str());
  return true;
}

/// An s3rver on 127.0.0.1 with bucket "cairn-test", storing under a temporary directory.
struct s3rver {
  std::filesystem::path dir;
  std::string bucket = "cairn-test";
  int port = 0;
  child proc;

  s3rver() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cairn-s3rver-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    dir = tmpl;
    for (int tries = 0; tries < 3; ++tries) {
      port = free_port();
      if (start()) return;
      proc.kill();
    }
    throw std::runtime_error("s3rver did not start (" + s3rver_bin() + ")");
  }
  ~s3rver() {
    proc.kill();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  s3rver(const s3rver&) = delete;
  s3rver& operator=(const s3rver&) = delete;

  /// Starts (again) on the same port and directory; true once it accepts connections.
  bool start() {
    proc.start({s3rver_bin(), "-d", dir.string(), "-a", "127.0.0.1", "-p", std::to_string(port),
                "--silent", "--configure-bucket", bucket},
               {"NODE_OPTIONS=--openssl-legacy-provider"});
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < until) {
      if (port_open(port)) return true;
      if (!proc.running()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  /// Kills the server (SIGKILL), as a crash would.
  void kill() { proc.kill(); }

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port); }
};

/// A node script started with `args` and a file name last, to which it writes "PORT <n>" once
/// listening (the SlowDown proxy, the echoing server).
struct node_server {
  child proc;
  int port = 0;
  node_server(const std::vector<std::string>& args) {
    std::string out =
        (std::filesystem::temp_directory_path() /
         ("cairn-node-" + std::to_string(::getpid()) + "-" + std::to_string(free_port()) + ".txt"))
            .string();
    std::vector<std::string> argv{"node"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back(out);
    proc.start(argv, {});
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < until && port == 0) {
      if (FILE* f = std::fopen(out.c_str(), "r")) {
        int p = 0;
        if (std::fscanf(f, "PORT %d", &p) == 1) port = p;
        std::fclose(f);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::remove(out.c_str());
    if (port == 0) throw std::runtime_error("node " + args.at(0) + " did not start");
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port); }
};

/// Options for a storage on `endpoint` (s3rver accepts any credentials).
inline cairn::s3_options options_for(const std::string& endpoint) {
  cairn::s3_options o;
  o.endpoint = endpoint;
  o.region = "us-east-1";
  o.access_key = "S3RVER";
  o.secret_key = "S3RVER";
  o.deadline = std::chrono::seconds(20);
  o.backoff_initial = std::chrono::milliseconds(10);
  o.backoff_max = std::chrono::milliseconds(200);
  o.stall_timeout = std::chrono::seconds(5);
  o.part_size = std::size_t{1} << 20;  // small parts: tests exercise multipart uploads
  o.allow_small_parts = true;          // which s3rver accepts (S3 itself does not)
  return o;
}

/// The body of an HTTP GET of `url`, made with libcurl; the tests never run curl(1), which
/// a bare system does not have. Throws when the request fails or the status is not 200.
inline std::string http_get(const std::string& url) {
  CURL* h = ::curl_easy_init();
  if (!h) throw std::runtime_error("curl_easy_init failed");
  std::string body;
  auto on_data = +[](char* p, std::size_t size, std::size_t n, void* ud) -> std::size_t {
    static_cast<std::string*>(ud)->append(p, size * n);
    return size * n;
  };
  ::curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  ::curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  ::curl_easy_setopt(h, CURLOPT_TIMEOUT, 20L);
  ::curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
  ::curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
  CURLcode rc = ::curl_easy_perform(h);
  long status = 0;
  ::curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  ::curl_easy_cleanup(h);
  if (rc != CURLE_OK)
    throw std::runtime_error("GET " + url + " failed: " + ::curl_easy_strerror(rc));
  if (status != 200)
    throw std::runtime_error("GET " + url + " answered HTTP status " + std::to_string(status));
  return body;
}

/// Runs a shell command and returns its stdout (throws on a non-zero exit).
inline std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + cmd);
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = ::pclose(p);
  if (rc != 0)
    throw std::runtime_error("command failed (" + std::to_string(rc) + "): " + cmd + "\n" + out);
  return out;
}

/// The NODE_PATH that lets the node scripts require the packages in .deps/.
inline std::string node_env() { return "NODE_PATH='" + source_dir() + "/.deps/node_modules' "; }

}  // namespace cairn_s3_test
