#include "tests/testing/test_pki.h"

#include <fstream>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/child_process.h"

namespace jobbroker::testing {

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

absl::StatusOr<TestPki> MakePki(const TempDir& dir) {
  const std::string d = dir.path();
  absl::StatusOr<std::string> san = dir.WriteFile("san.ext", "subjectAltName=IP:127.0.0.1\n");
  if (!san.ok()) return san.status();
  auto key = [&](const std::string& name) -> std::vector<std::string> {
    return {"openssl", "req",      "-newkey",
            "ec",      "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes",  "-keyout",  d + "/" + name + ".key"};
  };
  std::vector<std::vector<std::string>> steps;
  std::vector<std::string> ca = key("ca");
  ca.insert(ca.end(),
            {"-x509", "-days", "2", "-subj", "/CN=jobbroker test CA", "-out", d + "/ca.crt"});
  steps.push_back(ca);
  for (const std::string name : {"server", "client"}) {
    std::vector<std::string> csr = key(name);
    csr.insert(csr.end(), {"-subj", "/CN=" + name, "-out", d + "/" + name + ".csr"});
    steps.push_back(csr);
    std::vector<std::string> sign = {"openssl",
                                     "x509",
                                     "-req",
                                     "-in",
                                     d + "/" + name + ".csr",
                                     "-CA",
                                     d + "/ca.crt",
                                     "-CAkey",
                                     d + "/ca.key",
                                     "-CAcreateserial",
                                     "-days",
                                     "2",
                                     "-out",
                                     d + "/" + name + ".crt"};
    if (name == "server") sign.insert(sign.end(), {"-extfile", *san});
    steps.push_back(sign);
  }
  for (std::vector<std::string>& argv : steps) {
    argv[0] = "/usr/bin/openssl";
    absl::StatusOr<CommandResult> run = RunCommand(d, argv);
    if (!run.ok()) return run.status();
    if (run->exit_code != 0) return absl::InternalError(absl::StrCat("openssl: ", run->output));
  }
  TestPki pki{.ca_cert = d + "/ca.crt",
              .server_cert = d + "/server.crt",
              .server_key = d + "/server.key",
              .client_cert = d + "/client.crt",
              .client_key = d + "/client.key"};
  for (auto [path, out] :
       {std::pair{pki.ca_cert, &pki.ca_pem}, std::pair{pki.client_cert, &pki.client_cert_pem},
        std::pair{pki.client_key, &pki.client_key_pem}}) {
    absl::StatusOr<std::string> text = ReadText(path);
    if (!text.ok()) return text.status();
    *out = *std::move(text);
  }
  return pki;
}

}  // namespace jobbroker::testing
