#include "client/cpp/cli/table.h"

#include <algorithm>
#include <utility>

namespace jobbroker::cli {

size_t DisplayWidth(const std::string& text) {
  return std::count_if(text.begin(), text.end(),
                       [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

Table::Table(std::vector<std::string> header)
    : header_(std::move(header)), right_(header_.size(), false) {}

void Table::AlignRight(size_t column) {
  if (column < right_.size()) right_[column] = true;
}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(header_.size());
  rows_.push_back(std::move(cells));
}

std::string Table::Render() const {
  std::vector<size_t> widths(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) widths[c] = DisplayWidth(header_[c]);
  for (const std::vector<std::string>& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], DisplayWidth(row[c]));
  }
  std::string out;
  auto render_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string pad(widths[c] - DisplayWidth(row[c]), ' ');
      const bool last = c + 1 == row.size();
      if (c > 0) line += "  ";
      if (right_[c]) {
        line += pad + row[c];
      } else {
        line += row[c];
        if (!last) line += pad;
      }
    }
    // A blank last cell would otherwise leave the padding of the previous ones behind.
    line.erase(line.find_last_not_of(' ') + 1);
    out += line;
    out += '\n';
  };
  render_row(header_);
  for (const std::vector<std::string>& row : rows_) render_row(row);
  return out;
}

}  // namespace jobbroker::cli
