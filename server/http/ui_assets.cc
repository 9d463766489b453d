#include "server/http/ui_assets.h"

#include "absl/strings/match.h"
#include "absl/strings/strip.h"

namespace jobbroker::server {
namespace {

absl::string_view ContentType(absl::string_view name) {
  struct Type {
    absl::string_view extension;
    absl::string_view content_type;
  };
  static constexpr Type kTypes[] = {
      {".html", "text/html; charset=utf-8"},
      {".js", "text/javascript; charset=utf-8"},
      {".css", "text/css; charset=utf-8"},
      {".svg", "image/svg+xml"},
      {".png", "image/png"},
      {".ico", "image/x-icon"},
      {".json", "application/json"},
  };
  for (const Type& t : kTypes) {
    if (absl::EndsWith(name, t.extension)) return t.content_type;
  }
  return "application/octet-stream";
}

}  // namespace

bool FindUiAsset(absl::string_view path, UiAsset* asset) {
  if (!absl::ConsumePrefix(&path, "/")) return false;
  if (path.empty()) path = "index.html";
  if (absl::StrContains(path, '/')) return false;
  for (const EmbeddedFile* f = kEmbeddedUiFiles; !f->name.empty(); ++f) {
    if (f->name == path) {
      *asset = {f->body, ContentType(f->name)};
      return true;
    }
  }
  return false;
}

}  // namespace jobbroker::server
