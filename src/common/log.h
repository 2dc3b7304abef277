// Messages to the user on stderr, one line each, prefixed with the tool's name.
#pragma once

#include <fmt/format.h>

#include <cstdio>

namespace gpuscope {

inline bool g_verbose = false;

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  fmt::print(stderr, "gpuscope: {}\n", fmt::format(f, std::forward<Args>(args)...));
}

template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  fmt::print(stderr, "gpuscope: error: {}\n", fmt::format(f, std::forward<Args>(args)...));
}

template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  fmt::print(stderr, "gpuscope: warning: {}\n", fmt::format(f, std::forward<Args>(args)...));
}

template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (g_verbose) fmt::print(stderr, "gpuscope: {}\n", fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace gpuscope
