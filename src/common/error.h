// The error users see: one line that says what went wrong and what to do.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace gpuscope {

class Error : public std::runtime_error {
 public:
  template <typename... Args>
  explicit Error(fmt::format_string<Args...> f, Args&&... args)
      : std::runtime_error(fmt::format(f, std::forward<Args>(args)...)) {}
};

}  // namespace gpuscope
