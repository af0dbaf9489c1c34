// Compiled with the lock part's include path: guard's private header is not
// on it, so a part that reached into another's src/ would not compile.
#include "guard/async_internal.hpp"
