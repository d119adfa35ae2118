/* Atomic accesses for the scheduler's lock-free structures (private header).
 * Normal builds use Concurrency Kit's ck_pr operations; the orderings come from
 * explicit ck_pr_fence_* calls at each use site, each commented there.
 *
 * ThreadSanitizer neither sees ck_pr's inline assembly nor models standalone
 * fences, so it would report every hand-over of a task between threads as a
 * race. Under TSan the same accesses are therefore spelled as C11 __atomic
 * operations (loads acquire, stores release, read-modify-writes seq_cst) that
 * it does model. The ck_pr fences stay in place in both builds (TSan ignores
 * them, the CPU does not), so the machine code orders memory the same way;
 * TSan then checks the hand-over protocol, not our fence placement, which is
 * argued in comments next to each fence. */
#ifndef VRPC_SCHED_ATOMIC_H
#define VRPC_SCHED_ATOMIC_H

#include <ck_pr.h>
#include <stdbool.h>
#include <stdint.h>

#if defined(__SANITIZE_THREAD__)
#define VRPC_SCHED_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define VRPC_SCHED_TSAN 1
#endif
#endif

#ifdef VRPC_SCHED_TSAN

static inline uint64_t vs_load_64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void vs_store_64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline uint32_t vs_load_32(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void vs_store_32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline void *vs_load_ptr(void *const *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void vs_store_ptr(void **p, void *v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline bool vs_cas_64(uint64_t *p, uint64_t old, uint64_t v)
{
    return __atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
static inline bool vs_cas_ptr(void **p, void *old, void *v)
{
    return __atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
static inline void *vs_fas_ptr(void **p, void *v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
static inline void vs_fas_64(uint64_t *p, uint64_t v) { __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
static inline void vs_faa_64(uint64_t *p, int64_t d) { __atomic_fetch_add(p, (uint64_t)d, __ATOMIC_SEQ_CST); }
static inline uint32_t vs_faa_32(uint32_t *p, int32_t d)
{
    return __atomic_fetch_add(p, (uint32_t)d, __ATOMIC_SEQ_CST);
}
static inline void vs_bts_64(uint64_t *p, unsigned bit) { __atomic_fetch_or(p, UINT64_C(1) << bit, __ATOMIC_SEQ_CST); }
/* Clears the bit; true if this call cleared it (it was set). */
static inline bool vs_btr_64(uint64_t *p, unsigned bit)
{
    uint64_t m = UINT64_C(1) << bit;
    return (__atomic_fetch_and(p, ~m, __ATOMIC_SEQ_CST) & m) != 0;
}
/* Statistics: no ordering needed, only freedom from data races. */
static inline uint64_t vs_load_stat(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline void vs_store_stat(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }

#else /* !VRPC_SCHED_TSAN */

static inline uint64_t vs_load_64(const uint64_t *p) { return ck_pr_load_64(p); }
static inline void vs_store_64(uint64_t *p, uint64_t v) { ck_pr_store_64(p, v); }
static inline uint32_t vs_load_32(const uint32_t *p) { return ck_pr_load_32(p); }
static inline void vs_store_32(uint32_t *p, uint32_t v) { ck_pr_store_32(p, v); }
static inline void *vs_load_ptr(void *const *p) { return ck_pr_load_ptr(p); }
static inline void vs_store_ptr(void **p, void *v) { ck_pr_store_ptr(p, v); }
static inline bool vs_cas_64(uint64_t *p, uint64_t old, uint64_t v) { return ck_pr_cas_64(p, old, v); }
static inline bool vs_cas_ptr(void **p, void *old, void *v) { return ck_pr_cas_ptr(p, old, v); }
static inline void *vs_fas_ptr(void **p, void *v) { return ck_pr_fas_ptr(p, v); }
static inline void vs_fas_64(uint64_t *p, uint64_t v) { (void)ck_pr_fas_64(p, v); }
static inline void vs_faa_64(uint64_t *p, int64_t d) { ck_pr_add_64(p, (uint64_t)d); }
static inline uint32_t vs_faa_32(uint32_t *p, int32_t d) { return ck_pr_faa_32(p, (uint32_t)d); }
static inline void vs_bts_64(uint64_t *p, unsigned bit) { ck_pr_bts_64(p, bit); }
static inline bool vs_btr_64(uint64_t *p, unsigned bit) { return ck_pr_btr_64(p, bit); }
static inline uint64_t vs_load_stat(const uint64_t *p) { return ck_pr_load_64(p); }
static inline void vs_store_stat(uint64_t *p, uint64_t v) { ck_pr_store_64(p, v); }

#endif /* VRPC_SCHED_TSAN */

#endif
