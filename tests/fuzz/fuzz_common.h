/* What every harness in tests/fuzz/ shares: the libFuzzer entry point's
 * prototype, and a check that aborts with a message (an abort is what
 * libFuzzer records as a crash, with the input that caused it). */
#ifndef VRPC_FUZZ_COMMON_H
#define VRPC_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond, ...)                                                                    \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);             \
            fprintf(stderr, __VA_ARGS__);                                                        \
            fputc('\n', stderr);                                                                 \
            abort();                                                                             \
        }                                                                                        \
    } while (0)

#endif
