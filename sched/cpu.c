/* The scheduler's view of the CPUs: how many the process may run on, and
 * pinning a worker to one of them. */
#define _GNU_SOURCE /* sched_getaffinity, pthread_setaffinity_np */
#include "sched/cpu.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

/* Pin the calling worker to the (idx mod n)-th CPU of mask (0: of the CPUs
 * the process may run on). */
void vrpc_sched_pin_self(unsigned idx, uint64_t mask)
{
    cpu_set_t allowed, one;
    int cnt, k;

    if (mask) {
        CPU_ZERO(&allowed);
        for (int c = 0; c < 64; c++)
            if (mask & (1ull << c))
                CPU_SET(c, &allowed);
    } else if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
        return;
    }
    if ((cnt = CPU_COUNT(&allowed)) == 0)
        return;
    k = (int)(idx % (unsigned)cnt);
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (CPU_ISSET(cpu, &allowed) && k-- == 0) {
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
            return;
        }
    }
}

unsigned vrpc_sched_online_cpus(void)
{
    cpu_set_t set;
    long n;

    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
        return (unsigned)CPU_COUNT(&set);
    n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}
