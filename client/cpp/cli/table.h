#pragma once

#include <string>
#include <vector>

namespace jobbroker::cli {

// A text table for terminals: a header row, then rows, each column padded to its widest cell
// (counted in UTF-8 characters) and two spaces apart. Cells should be one line (see OneLine).
class Table {
 public:
  explicit Table(std::vector<std::string> header);

  // Right-aligns column `column` (0-based): for numbers.
  void AlignRight(size_t column);
  // Adds a row; missing cells are blank, extra ones dropped.
  void AddRow(std::vector<std::string> cells);
  bool empty() const { return rows_.empty(); }

  // Every line ends in '\n'; the last column carries no trailing padding.
  std::string Render() const;

 private:
  const std::vector<std::string> header_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

// Display width of `text`, in characters: UTF-8 continuation bytes do not count.
size_t DisplayWidth(const std::string& text);

}  // namespace jobbroker::cli
