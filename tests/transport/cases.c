/* Conformance cases: credits and back-pressure, many connections, peer close
 * and crash, close during traffic, listener close with pending accepts. */
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

int peer_child_main(const char *backend, const char *uri)
{
    return 1;
}
