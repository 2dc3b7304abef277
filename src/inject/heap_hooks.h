// The heap hooks of libgpuscope_launches.so (heap_hooks.cpp) and what gpuscope tells them.
#pragma once

// Set by `gpuscope record` in the environment of the command it starts: the size from which a
// heap block is handed over (bytes; unset or 0: the hooks only pass calls on).
#define GS_HEAP_ALLOC_ENV "GPUSCOPE_HEAP_ALLOC_MIN"
// Blocks handed over a second at most (after a burst of as many): each costs its thread a trap.
#define GS_HEAP_ALLOCS_PER_S 1000
