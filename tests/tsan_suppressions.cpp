// Linked into every test binary (tests/CMakeLists.txt). ThreadSanitizer reads this when the test binary is built with
// -fsanitize=thread (the symbol is a weak hook in its runtime; elsewhere it is
// an unused function).
//
// Why: Debian's libstdc++ is not instrumented, so TSan cannot see the atomic
// reference count inside std::exception_ptr. A future's exception set on the
// event-loop thread and rethrown by the caller's get() is then freed by
// whichever thread drops the last reference, and TSan reports that free as a
// race with the caller's earlier read. It is ordered by that atomic count; the
// report is a false positive, and this is the narrowest suppression for it.
extern "C" const char* __tsan_default_suppressions();
extern "C" const char* __tsan_default_suppressions() {
  return "race:std::__exception_ptr::exception_ptr::_M_release\n";
}
