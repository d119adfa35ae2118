/* sched/cpu: the CPUs the scheduler's workers run on (private to sched/). */
#ifndef VRPC_SCHED_CPU_H
#define VRPC_SCHED_CPU_H

#include <stdint.h>

/* Pins the calling thread (worker idx) to the (idx mod n)-th of the n CPUs
 * in mask (0: of the CPUs the process may run on). Best effort: nothing
 * happens when the mask is empty or the call fails. */
void vrpc_sched_pin_self(unsigned idx, uint64_t mask);

/* The number of CPUs the process may run on (at least 1). */
unsigned vrpc_sched_online_cpus(void);

#endif
