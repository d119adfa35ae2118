/* TCP-only cases: peers that send garbage, a 4 GiB frame header, half a frame
 * then close, or one byte at a time. Each must only end its own connection
 * with a logged protocol error while a healthy connection carries on. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "cases.h"
