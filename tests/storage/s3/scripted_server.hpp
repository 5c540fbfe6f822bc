// An HTTP/1.1 server on 127.0.0.1, in the test process, that answers each request with what a
// test's handler says: the unit tests of storage/s3/ use it to play an S3 server that fails, lies
// or misbehaves in exactly the way a case needs (no node, no s3rver). One thread per connection;
// every answer closes its connection. The handler may be called from several threads at once.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cairn/storage/s3/options.hpp"

namespace cairn_s3_unit {

/// A request as the server received it.
struct http_request {
  std::string method, target, path, query;     ///< target = path[?query], as sent
  std::map<std::string, std::string> headers;  ///< lower-case names
  std::string body;
  /// The value of query parameter `name` as sent (still percent-encoded), or "".
  std::string param(const std::string& name) const {
    std::size_t at = 0;
    while (at <= query.size()) {
      std::size_t amp = query.find('&', at);
      std::string pair = query.substr(at, amp == std::string::npos ? std::string::npos : amp - at);
      std::size_t eq = pair.find('=');
      if (pair.substr(0, eq) == name) return eq == std::string::npos ? "" : pair.substr(eq + 1);
      if (amp == std::string::npos) break;
      at = amp + 1;
    }
    return {};
  }
  bool has_param(const std::string& name) const {
    return ("&" + query + "&").find("&" + name + "=") != std::string::npos ||
           ("&" + query + "&").find("&" + name + "&") != std::string::npos;
  }
};

/// What to answer. With `raw` set, exactly those bytes are sent (status, headers and body are
/// ignored); otherwise a response with Content-Length (unless `headers` has one) and
/// "Connection: close". The connection then stays open `hold_ms` (a server that stops talking).
struct http_reply {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string raw;
  int hold_ms = 0;
};

/// The "<Error>" body of an S3 error answer.
inline std::string error_xml(const std::string& code, const std::string& message) {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>" + code + "</Code><Message>" +
         message + "</Message></Error>";
}

class scripted_server {
 public:
  using handler = std::function<http_reply(const http_request&)>;

  explicit scripted_server(handler h) : handler_(std::move(h)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 64) != 0)
      throw std::runtime_error("scripted_server: cannot listen");
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~scripted_server() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    acceptor_.join();
    for (auto& t : connections_) t.join();
    ::close(fd_);
  }
  scripted_server(const scripted_server&) = delete;
  scripted_server& operator=(const scripted_server&) = delete;

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  /// Every request received so far, in the order they arrived.
  std::vector<http_request> requests() const {
    std::lock_guard lock(mu_);
    return requests_;
  }
  /// The most requests that were being answered at the same moment.
  int max_concurrent() const { return max_active_.load(); }

 private:
  void accept_loop() {
    while (true) {
      {
        std::lock_guard lock(mu_);
        if (stop_) return;
      }
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      std::lock_guard lock(mu_);
      connections_.emplace_back([this, c] { serve(c); });
    }
  }

  // Reads until `want` bytes are buffered or the peer stops; false on EOF, error or 10 s silence.
  static bool fill(int c, std::string& buf, std::size_t want) {
    char tmp[65536];
    while (buf.size() < want) {
      pollfd p{c, POLLIN, 0};
      if (::poll(&p, 1, 10000) <= 0) return false;
      ssize_t n = ::recv(c, tmp, sizeof tmp, 0);
      if (n <= 0) return false;
      buf.append(tmp, static_cast<std::size_t>(n));
    }
    return true;
  }

  void serve(int c) {
    std::string buf;
    std::size_t head_end;
    while ((head_end = buf.find("\r\n\r\n")) == std::string::npos) {
      if (!fill(c, buf, buf.size() + 1)) {
        ::close(c);
        return;
      }
    }
    http_request req;
    std::string head = buf.substr(0, head_end);
    std::size_t eol = head.find("\r\n");
    std::string line = head.substr(0, eol);
    std::size_t s1 = line.find(' '), s2 = line.rfind(' ');
    req.method = line.substr(0, s1);
    req.target = line.substr(s1 + 1, s2 - s1 - 1);
    std::size_t q = req.target.find('?');
    req.path = req.target.substr(0, q);
    req.query = q == std::string::npos ? "" : req.target.substr(q + 1);
    for (std::size_t at = eol; at != std::string::npos && at < head.size();) {
      std::size_t next = head.find("\r\n", at + 2);
      std::string h =
          head.substr(at + 2, next == std::string::npos ? std::string::npos : next - at - 2);
      std::size_t colon = h.find(':');
      if (colon != std::string::npos) {
        std::string k = h.substr(0, colon);
        for (char& ch : k) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        std::size_t v = h.find_first_not_of(' ', colon + 1);
        req.headers[k] = v == std::string::npos ? "" : h.substr(v);
      }
      at = next;
    }
    std::size_t body_len = 0;
    if (auto it = req.headers.find("content-length"); it != req.headers.end())
      body_len = static_cast<std::size_t>(std::strtoull(it->second.c_str(), nullptr, 10));
    fill(c, buf, head_end + 4 + body_len);
    req.body = buf.substr(head_end + 4, body_len);
    {
      std::lock_guard lock(mu_);
      requests_.push_back(req);
    }
    const int now = ++active_;
    for (int m = max_active_.load(); now > m && !max_active_.compare_exchange_weak(m, now);) {
    }
    http_reply rep = handler_(req);
    std::string out = rep.raw;
    if (out.empty()) {
      out = "HTTP/1.1 " + std::to_string(rep.status) + " Whatever\r\n";
      bool has_length = false;
      for (const auto& [k, v] : rep.headers) {
        out += k + ": " + v + "\r\n";
        std::string lk = k;
        for (char& ch : lk) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        has_length |= lk == "content-length";
      }
      if (!has_length) out += "Content-Length: " + std::to_string(rep.body.size()) + "\r\n";
      out += "Connection: close\r\n\r\n";
      if (req.method != "HEAD") out += rep.body;
    }
    // Counted as answered before the answer leaves: a client cannot have it, and so cannot have
    // sent its next request, while this request still counts.
    --active_;
    for (std::size_t sent = 0; sent < out.size();) {
      ssize_t n = ::send(c, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<std::size_t>(n);
    }
    if (rep.hold_ms > 0) {
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(rep.hold_ms), [&] { return stop_; });
    }
    ::shutdown(c, SHUT_RDWR);
    ::close(c);
  }

  handler handler_;
  int fd_ = -1, port_ = 0;
  std::thread acceptor_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<std::thread> connections_;
  std::vector<http_request> requests_;
  std::atomic<int> active_{0}, max_active_{0};
};

/// Options that point an s3_client or s3_storage at `endpoint` with fixed credentials and short
/// retry delays.
inline cairn::s3_options unit_options(const std::string& endpoint) {
  cairn::s3_options o;
  o.endpoint = endpoint;
  o.region = "us-east-1";
  o.access_key = "AKIDUNITTEST";
  o.secret_key = "unit-test-secret-key-0123456789abcdef";
  o.deadline = std::chrono::seconds(20);
  o.backoff_initial = std::chrono::milliseconds(1);
  o.backoff_max = std::chrono::milliseconds(4);
  o.stall_timeout = std::chrono::seconds(5);
  o.max_attempts = 3;
  return o;
}

}  // namespace cairn_s3_unit
