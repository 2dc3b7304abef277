// Checks, before anything is loaded, that this machine and user can trace: each failure is
// a one-line Error that says what to do.
#pragma once

#include <string_view>

namespace gpuscope::attach {

// `command`: what the user ran ("gpuscope record", "gpuscope agent"), as the messages name it.
void check_can_trace(std::string_view command);

// Raises this process's soft limit on open files to its hard limit: each probe link is a file,
// and links of processes that exited wait to close (see LinkCloser). Not for a process whose
// children must keep the limit they would have had (record's command inherits it).
void raise_open_file_limit();

}  // namespace gpuscope::attach
