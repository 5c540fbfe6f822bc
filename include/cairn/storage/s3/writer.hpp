// cairn/storage/s3/writer.hpp: s3_writer, the object writer of s3_storage: a multipart upload
// whose parts go up from the writing threads as they complete, or one PUT for a small object.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cairn/core/error.hpp"
#include "cairn/storage/s3/client.hpp"
#include "cairn/storage/s3/xml.hpp"
#include "cairn/storage/storage.hpp"

namespace cairn::detail {

/// The writer of s3_storage: buffers whole parts, uploads each part as soon as it is complete
/// (from the writing thread, so parts go up in parallel), and on finish() completes the
/// multipart upload — or sends one PUT when no part was ever complete. Until then nothing is
/// visible under the name. A writer that is dropped or fails aborts its multipart upload.
class s3_writer final : public object_writer {
 public:
  s3_writer(std::shared_ptr<s3_client> c, std::string name)
      : c_(std::move(c)),
        name_(std::move(name)),
        key_(c_->key_of(name_)),
        part_size_(c_->options().part_size) {}
  s3_writer(const s3_writer&) = delete;
  s3_writer& operator=(const s3_writer&) = delete;
  ~s3_writer() override {
    std::lock_guard lock(mu_);
    if (!finished_ && !upload_id_.empty()) abort_locked();
  }

  result<void> write_at(std::uint64_t offset, std::span<const std::byte> data) override {
    {
      std::lock_guard lock(mu_);
      if (finished_) return usage("write_at after finish()");
      if (failed_) return *failed_;
      if (data.size() > UINT64_MAX - offset) return usage("write range overflows");
      // S3 holds at most 10,000 parts and 5 TiB per object: refuse what no upload can hold,
      // now, rather than at the completion after every part was sent.
      const std::uint64_t limit = std::min<std::uint64_t>(
          std::uint64_t{5} << 40, static_cast<std::uint64_t>(part_size_) * 10000);
      if (offset + data.size() > limit)
        return usage("write ending at byte " + std::to_string(offset + data.size()) +
                     " is past what S3 holds in one object of 10,000 parts of " +
                     std::to_string(part_size_) +
                     " bytes (at most 5 TiB; raise s3_options::" + "part_size)");
      end_ = std::max(end_, offset + data.size());
    }
    std::uint64_t pos = offset;
    std::size_t done = 0;
    while (done < data.size()) {
      const std::uint64_t idx = pos / part_size_;
      const std::uint64_t part_begin = idx * part_size_;
      const std::size_t in_part = static_cast<std::size_t>(pos - part_begin);
      const std::size_t len = std::min<std::size_t>(part_size_ - in_part, data.size() - done);
      std::span<const std::byte> chunk = data.subspan(done, len);
      auto r = write_part(idx, in_part, chunk);
      if (!r) {
        std::lock_guard lock(mu_);
        if (!failed_) failed_ = r.err();
        error e = r.err();
        e.offset = pos;
        return e;
      }
      pos += len;
      done += len;
    }
    return ok();
  }

  result<void> finish() override {
    std::unique_lock lock(mu_);
    if (finished_) return usage("finish() called twice");
    finished_ = true;
    if (failed_) {
      if (!upload_id_.empty()) abort_locked();
      return *failed_;
    }
    return upload_id_.empty() ? put_whole_locked() : complete_locked();
  }

 private:
  // finish() when no part was ever complete: one PUT of the whole object.
  result<void> put_whole_locked() {
    std::vector<std::byte> whole(static_cast<std::size_t>(end_));
    for (auto& [idx, p] : parts_) {
      if (!p.buf) continue;
      std::uint64_t b = idx * part_size_;
      std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(part_size_, end_ - b));
      std::memcpy(whole.data() + b, p.buf.get(), n);
    }
    parts_.clear();
    s3_http_request r;
    r.method = "PUT";
    r.key = key_;
    r.body = whole;
    CAIRN_TRY_ASSIGN(auto resp, c_->perform(r, "PUT", name_));
    if (resp.status != 200) return c_->http_error(resp, "PUT", key_, name_);
    ++c_->puts_;
    c_->bytes_put_ += whole.size();
    return ok();
  }

  // finish() of a multipart upload: uploads every part not yet uploaded (partially written ones
  // are zero-filled), then completes the upload; aborts it on failure.
  result<void> complete_locked() {
    const std::uint64_t nparts = (end_ + part_size_ - 1) / part_size_;
    for (std::uint64_t idx = 0; idx < nparts; ++idx) {
      part& p = parts_[idx];
      if (!p.etag.empty()) continue;
      if (!p.buf) p.buf = zeroed(part_size_);
      const std::uint64_t b = idx * part_size_;
      std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(part_size_, end_ - b));
      auto r = upload_part(idx, {p.buf.get(), n});
      if (!r) {
        abort_locked();
        return r.err();
      }
      p.etag = *r;
      p.buf.reset();
    }
    std::string xml = "<CompleteMultipartUpload>";
    for (std::uint64_t idx = 0; idx < nparts; ++idx) {
      xml += "<Part><PartNumber>" + std::to_string(idx + 1) + "</PartNumber><ETag>" +
             xml_escape(parts_[idx].etag) + "</ETag></Part>";
    }
    xml += "</CompleteMultipartUpload>";
    s3_http_request r;
    r.method = "POST";
    r.key = key_;
    r.query = {{"uploadId", upload_id_}};
    r.body = std::as_bytes(std::span(xml));
    auto resp = c_->perform(r, "CompleteMultipartUpload", name_);
    if (!resp || resp->status != 200 || resp->text.find("<Error>") != std::string::npos) {
      error e = resp ? c_->http_error(*resp, "CompleteMultipartUpload", key_, name_) : resp.err();
      abort_locked();
      return e;
    }
    ++c_->mp_completed_;
    parts_.clear();
    return ok();
  }

  struct part {
    std::unique_ptr<std::byte[]> buf;
    std::size_t filled = 0;
    bool uploading = false;
    std::string etag;
  };

  static std::unique_ptr<std::byte[]> zeroed(std::size_t n) {
    return std::unique_ptr<std::byte[]>(new std::byte[n]());
  }

  error usage(const std::string& what) const {
    error e = make_error(errc::invalid_argument, what + " on " + c_->describe(name_));
    e.file = c_->describe(name_);
    return e;
  }

  // Copies a chunk into its part, uploading the part once it is full. A chunk that is a whole
  // part goes up straight from the caller's memory.
  result<void> write_part(std::uint64_t idx,
                          std::size_t in_part,
                          std::span<const std::byte> chunk) {
    std::byte* dst = nullptr;
    bool direct = false;
    {
      std::lock_guard lock(mu_);
      part& p = parts_[idx];
      if (p.uploading || !p.etag.empty())
        return usage("write_at into part " + std::to_string(idx + 1) +
                     " after it was complete (overlapping writes)");
      if (chunk.size() == part_size_ && !p.buf) {
        p.uploading = direct = true;
      } else {
        if (!p.buf) p.buf = zeroed(part_size_);
        dst = p.buf.get();
      }
    }
    std::span<const std::byte> payload = chunk;
    std::unique_ptr<std::byte[]> owned;
    if (!direct) {
      std::memcpy(dst + in_part, chunk.data(), chunk.size());
      std::lock_guard lock(mu_);
      part& p = parts_[idx];
      p.filled += chunk.size();
      if (p.filled < part_size_) return ok();
      p.uploading = true;
      owned = std::move(p.buf);
      payload = {owned.get(), part_size_};
    }
    CAIRN_TRY(ensure_upload());
    auto etag = upload_part(idx, payload);
    std::lock_guard lock(mu_);
    part& p = parts_[idx];
    p.uploading = false;
    if (!etag) return etag.err();
    p.etag = *etag;
    return ok();
  }

  result<void> ensure_upload() {
    std::lock_guard lock(create_mu_);
    {
      std::lock_guard l2(mu_);
      if (!upload_id_.empty()) return ok();
    }
    s3_http_request r;
    r.method = "POST";
    r.key = key_;
    r.query = {{"uploads", ""}};
    CAIRN_TRY_ASSIGN(auto resp, c_->perform(r, "CreateMultipartUpload", name_));
    if (resp.status != 200) return c_->http_error(resp, "CreateMultipartUpload", key_, name_);
    std::string id = xml_first(resp.text, "UploadId");
    if (id.empty()) {
      error e = make_error(errc::io,
                           "S3 CreateMultipartUpload of key \"" + key_ + "\" returned no UploadId");
      e.file = c_->describe(name_);
      return e;
    }
    std::lock_guard l2(mu_);
    upload_id_ = std::move(id);
    return ok();
  }

  result<std::string> upload_part(std::uint64_t idx, std::span<const std::byte> payload) {
    std::string id;
    {
      // upload_id_ is only written once, before any part uploads; reading it under mu_ when the
      // caller does not hold it would deadlock finish(), which holds mu_.
      id = upload_id_;
    }
    s3_http_request r;
    r.method = "PUT";
    r.key = key_;
    r.query = {{"partNumber", std::to_string(idx + 1)}, {"uploadId", id}};
    r.body = payload;
    CAIRN_TRY_ASSIGN(auto resp, c_->perform(r, "UploadPart", name_));
    if (resp.status != 200) return c_->http_error(resp, "UploadPart", key_, name_);
    auto it = resp.headers.find("etag");
    if (it == resp.headers.end() || it->second.empty()) {
      error e = make_error(errc::io, "S3 UploadPart of key \"" + key_ + "\" returned no ETag");
      e.file = c_->describe(name_);
      return e;
    }
    ++c_->parts_;
    c_->bytes_put_ += payload.size();
    return it->second;
  }

  // Best effort: servers without AbortMultipartUpload (s3rver answers 405) keep the parts
  // invisible; a bucket lifecycle rule cleans them up on AWS.
  void abort_locked() {
    if (upload_id_.empty()) return;
    s3_http_request r;
    r.method = "DELETE";
    r.key = key_;
    r.query = {{"uploadId", upload_id_}};
    (void)c_->perform(r, "AbortMultipartUpload", name_, /*max_attempts=*/2);
    ++c_->mp_aborted_;
    upload_id_.clear();
  }

  std::shared_ptr<s3_client> c_;
  std::string name_, key_;
  std::size_t part_size_;
  std::mutex mu_, create_mu_;
  std::map<std::uint64_t, part> parts_;
  std::uint64_t end_ = 0;
  std::string upload_id_;
  bool finished_ = false;
  std::optional<error> failed_;
};

}  // namespace cairn::detail
