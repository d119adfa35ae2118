/* Minimal futex wait/wake on a 32-bit word (private to the process). */
#ifndef VRPC_RPC_FUTEX_H
#define VRPC_RPC_FUTEX_H

#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Sleep while *addr == val (spurious wake-ups possible: re-check). */
static inline void vrpc_futex_wait(uint32_t *addr, uint32_t val)
{
    syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}
static inline void vrpc_futex_wake_all(uint32_t *addr)
{
    syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

#endif
