#pragma once

#include "absl/strings/string_view.h"

namespace jobbroker::server {

// One file of the dashboard (ui/), embedded in the binary at build time.
struct EmbeddedFile {
  absl::string_view name;  // "index.html": the file's name in ui/
  absl::string_view body;
};

// Every file of ui/, ended by an entry with an empty name (generated: cmake/embed_files.cmake).
extern const EmbeddedFile kEmbeddedUiFiles[];

struct UiAsset {
  absl::string_view body;
  absl::string_view content_type;  // from the name's extension
};

// The dashboard file served at `path` ("/" is index.html, "/app.js" is ui/app.js); false if
// there is none. Only names directly in ui/: anything with a second "/" is not found.
bool FindUiAsset(absl::string_view path, UiAsset* asset);

}  // namespace jobbroker::server
