#include "tests/cluster/jepsen/toxiproxy.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/testing/http_client.h"

namespace jobbroker::jepsen {
namespace {

absl::Status Expect(const absl::StatusOr<testing::HttpResponse>& response, int ok_status,
                    const std::string& what) {
  if (!response.ok()) return response.status();
  if (response->status != ok_status) {
    return absl::InternalError(
        absl::StrCat("toxiproxy: ", what, ": HTTP ", response->status, ": ", response->body));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Toxiproxy>> Toxiproxy::Start(const std::string& binary, int api_port,
                                                            const std::string& log_path) {
  auto process = testing::ChildProcess::Start(
      {binary, "-host", "127.0.0.1", "-port", absl::StrCat(api_port)}, log_path);
  if (!process.ok()) return process.status();
  std::unique_ptr<Toxiproxy> proxy(
      new Toxiproxy(absl::StrCat("127.0.0.1:", api_port), *std::move(process)));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (true) {
    auto version = testing::HttpGetResponse(proxy->api_, "/version", absl::Seconds(1));
    if (version.ok() && version->status == 200) return proxy;
    if (!proxy->process_->Running() || absl::Now() > deadline) {
      return absl::UnavailableError(absl::StrCat("toxiproxy did not answer at ", proxy->api_, ": ",
                                                 proxy->process_->ReadLog()));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::Status Toxiproxy::Create(const std::string& name, const std::string& listen,
                               const std::string& upstream) {
  const std::string body = absl::StrCat(R"({"name":")", name, R"(","listen":")", listen,
                                        R"(","upstream":")", upstream, R"(","enabled":true})");
  return Expect(testing::HttpSend(api_, "POST", "/proxies", {"Content-Type: application/json"},
                                  body, absl::Seconds(5)),
                201, absl::StrCat("create ", name));
}

absl::Status Toxiproxy::SetEnabled(const std::string& name, bool enabled) {
  return Expect(
      testing::HttpSend(api_, "POST", absl::StrCat("/proxies/", name),
                        {"Content-Type: application/json"},
                        enabled ? R"({"enabled":true})" : R"({"enabled":false})", absl::Seconds(5)),
      200, absl::StrCat(enabled ? "enable " : "disable ", name));
}

}  // namespace jobbroker::jepsen
