// Text of the report's sections: numbers, sizes and times as people read them, and aligned tables.
// Shared by the sections (sections/), each in a file of its own.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpuscope::report {

int64_t i64(const nlohmann::json& j, const char* key);
std::string str(const nlohmann::json& j, const char* key);

// Columns are measured in characters, not bytes (µ, ×, …).
size_t width(std::string_view s);
// At most n characters: the first n - 1 and an ellipsis.
std::string shorten(const std::string& s, size_t n);
std::string bytes_text(int64_t b);
std::string time_text(int64_t ns);
// 1234567 → "1,234,567".
std::string num(int64_t n);
std::string count_of(int64_t n, std::string_view noun);  // "3 allocations", "1 allocation"
void heading(std::string& out, const std::string& title);
// Where a call came from: its Python line, when it has one, then the first native frame outside
// CUDA ({"site", "python"} of a call site in the report's JSON).
std::string site_text(const nlohmann::json& j, size_t width);

class Table {
 public:
  // A heading starting with '>' is right-aligned (numbers).
  explicit Table(std::vector<std::string> headings);
  void add(std::vector<std::string> row);
  std::string render(size_t indent = 2) const;

 private:
  std::vector<bool> right_;
  std::vector<std::string> cells_;  // row by row, the headings first
};

// The n largest counts, ties in key order.
template <typename Map>
auto by_count(const Map& m, size_t n) {
  std::vector<std::pair<typename Map::key_type, int64_t>> v(m.begin(), m.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (v.size() > n) v.resize(n);
  return v;
}

}  // namespace gpuscope::report
