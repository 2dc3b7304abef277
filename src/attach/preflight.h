// Checks, before anything is loaded, that this machine and user can trace: each failure is
// a one-line Error that says what to do.
#pragma once

#include <string_view>

namespace gpuscope::attach {

// `command`: what the user ran ("gpuscope record", "gpuscope agent"), as the messages name it.
void check_can_trace(std::string_view command);

}  // namespace gpuscope::attach
