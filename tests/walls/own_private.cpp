// Compiled with the lock part's include path: its own private header is found.
#include "lock/lease_timeline.hpp"
