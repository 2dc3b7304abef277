#include "report/format.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdlib>

namespace gpuscope::report {

using nlohmann::json;

int64_t i64(const json& j, const char* key) { return j.at(key).get<int64_t>(); }
std::string str(const json& j, const char* key) { return j.at(key).get<std::string>(); }

size_t width(std::string_view s) {
  return std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

std::string shorten(const std::string& s, size_t n) {
  if (width(s) <= n) return s;
  size_t i = 0;
  for (size_t chars = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 && ++chars == n) break;
  return s.substr(0, i) + "…";
}

std::string bytes_text(int64_t b) {
  const double v = double(b);
  if (std::abs(b) >= (int64_t(1) << 30)) return fmt::format("{:.2f} GiB", v / double(1 << 30));
  if (std::abs(b) >= (int64_t(1) << 20)) return fmt::format("{:.2f} MiB", v / double(1 << 20));
  if (std::abs(b) >= (int64_t(1) << 10)) return fmt::format("{:.1f} KiB", v / double(1 << 10));
  return fmt::format("{} B", b);
}

std::string time_text(int64_t ns) {
  if (ns >= 1'000'000'000) return fmt::format("{:.2f} s", double(ns) / 1e9);
  if (ns >= 1'000'000) return fmt::format("{:.2f} ms", double(ns) / 1e6);
  return fmt::format("{:.1f} µs", double(ns) / 1e3);
}

std::string num(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0 && std::isdigit(static_cast<unsigned char>(digits[i - 1]))) out += ',';
    out += digits[i];
  }
  return out;
}

std::string count_of(int64_t n, std::string_view noun) {
  return fmt::format("{} {}{}", num(n), noun, n == 1 ? "" : "s");
}

void heading(std::string& out, const std::string& title) { out += fmt::format("\n== {} ==\n", title); }

std::string site_text(const json& j, size_t width) {
  const std::string py = j.contains("python") ? str(j, "python") : "";
  return py.empty() ? shorten(str(j, "site"), width) : shorten(py + " via " + str(j, "site"), width);
}

Table::Table(std::vector<std::string> headings) {
  for (auto& h : headings) {
    right_.push_back(h.starts_with('>'));
    cells_.push_back(right_.back() ? h.substr(1) : h);
  }
}

void Table::add(std::vector<std::string> row) {
  row.resize(right_.size());
  cells_.insert(cells_.end(), row.begin(), row.end());
}

std::string Table::render(size_t indent) const {
  const size_t cols = right_.size();
  std::vector<size_t> w(cols, 0);
  for (size_t i = 0; i < cells_.size(); ++i) w[i % cols] = std::max(w[i % cols], width(cells_[i]));
  std::string out;
  for (size_t row = 0; row < cells_.size() / cols; ++row) {
    std::string line(indent, ' ');
    for (size_t c = 0; c < cols; ++c) {
      const std::string& cell = cells_[row * cols + c];
      const std::string pad(w[c] - width(cell), ' ');
      line += right_[c] ? pad + cell : cell + pad;
      if (c + 1 < cols) line += "  ";
    }
    out += line.erase(line.find_last_not_of(' ') + 1) + "\n";
  }
  return out;
}

}  // namespace gpuscope::report
