#include "tap.h"
int main(void) { ok(1, "stub"); return tap_done(); }
